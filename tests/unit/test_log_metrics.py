"""Metric regexes applied to a learner's output as its log tee writes it: the extraction
(service.domain.metrics.LogMetricExtractor: values, steps, several metrics, lines the tee
cut, caps, regexes RE2 refuses), its thread (worker.learner.logmetrics.LogMetrics: never
waits, skips rather than slows), the tee feeding it, and LogDirSync storing the document at
keys.log_metrics_key only when it changed, and at the end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from service.domain.metrics import (
    MAX_METRIC_LINE_CHARS,
    MAX_TENSORBOARD_POINTS,
    LogMetricExtractor,
    log_metric_cap,
    parse_log_metrics_document,
)
from service.logs import LogStore, all_records
from service.storage import keys
from tests.unit.test_logtee import tee_program
from tests.unit.test_tensorboard_metrics import CountingStore, spec
from worker.learner.logdir import LogDirSync
from worker.learner.logmetrics import LogMetrics
from worker.learner.logtee import MAX_LINE_BYTES, LogTee, split_pieces
from worker.learner.spec import LearnerSpec
from worker.learner.transfers import Transfers

LOSS = ("loss", r"loss=([0-9.eE+-]+)")
ACC = ("accuracy", r"acc(?:uracy)?[ :=]+([0-9.]+)")
T0 = 1_700_000_000.0


def extract(
    lines: list[str | tuple[str, bool]], metrics: list[tuple[str, str]]
) -> dict[str, list[tuple[float, int | None]]]:
    """(value, step) per metric of `lines` fed in order (a tuple: a piece and whether it
    ends its line)."""
    extractor = LogMetricExtractor(metrics)
    for i, line in enumerate(lines):
        text, ends = (line, True) if isinstance(line, str) else line
        extractor.feed(T0 + i, text, ends_line=ends)
    return {name: [(p[2], p[0]) for p in points] for name, points in extractor.points.items()}  # type: ignore[misc]


@pytest.mark.parametrize(
    ("line", "metrics", "expected"),
    [
        ("step 10 loss=0.5", [LOSS], {"loss": [(0.5, 10)]}),
        ("Step: 7, loss=1e-3", [LOSS], {"loss": [(0.001, 7)]}),
        ("STEP=42 loss=2", [LOSS], {"loss": [(2.0, 42)]}),
        ("global_step=3 loss=0.25", [LOSS], {"loss": [(0.25, 3)]}),
        ("loss=0.5", [LOSS], {"loss": [(0.5, None)]}),
        ("steps 200 loss=0.5", [LOSS], {"loss": [(0.5, None)]}),  # "steps" is not a step
        ("step " + "9" * 40 + " loss=1", [LOSS], {"loss": [(1.0, None)]}),  # no int64 step
        ("step 0000000000000000000007 loss=1", [LOSS], {"loss": [(1.0, 7)]}),
        ("loss=.", [LOSS], {"loss": []}),  # does not parse as a float
        ("loss=1e", [LOSS], {"loss": []}),
        ("loss=nan", [("loss", r"loss=(\S+)")], {"loss": []}),  # not finite: skipped
        ("loss=" + "9" * 400, [LOSS], {"loss": []}),  # inf: skipped
        ("nothing here", [LOSS, ACC], {"loss": [], "accuracy": []}),
        (
            "step 1 loss=0.5 accuracy: 0.9",
            [LOSS, ACC],
            {"loss": [(0.5, 1)], "accuracy": [(0.9, 1)]},
        ),
        ("accuracy: 0.9", [LOSS, ACC], {"loss": [], "accuracy": [(0.9, None)]}),
        ("loss=0.5 loss=0.4", [LOSS], {"loss": [(0.5, None)]}),  # first match per line
        ("val 0.75", [("val", r"val \d\.\d+")], {"val": []}),  # no group: whole match, no float
        ("0.75", [("val", r"\d\.\d+")], {"val": [(0.75, None)]}),
        ("x", [("opt", r"(y)?x")], {"opt": []}),  # the group did not take part
        ("step 3 loss=0.125", [("loss", r"loss=(?P<v>[0-9.]+)")], {"loss": [(0.125, 3)]}),
        ("LOSS=3", [("loss", r"(?i)loss=(\d)")], {"loss": [(3.0, None)]}),
        ("a loss=1 b", [("loss", r"^loss=(\d)")], {"loss": []}),  # anchors hold per line
    ],
)
def test_extraction_table(
    line: str, metrics: list[tuple[str, str]], expected: dict[str, list[tuple[float, int | None]]]
) -> None:
    assert extract([line], metrics) == expected


def test_thirty_two_metrics_each_found_where_it_is() -> None:
    metrics = [(f"m{i}", rf"\bm{i}=([0-9.]+)") for i in range(32)]
    lines = [f"step {n} m{n % 32}=0.{n}" for n in range(320)]
    found = extract(lines, metrics)
    for i in range(32):
        assert found[f"m{i}"] == [(float(f"0.{n}"), n) for n in range(i, 320, 32)]


def test_a_line_the_tee_cut_is_searched_whole_with_its_first_time_stamp() -> None:
    # "loss=" ends one piece and its value begins the next: found in neither piece alone.
    extractor = LogMetricExtractor([LOSS])
    extractor.feed(T0, "x" * 10 + " step 4 loss=", ends_line=False)
    extractor.feed(T0 + 1, "0.75", ends_line=False)
    extractor.feed(T0 + 2, " end", ends_line=True)
    extractor.feed(T0 + 3, "loss=2", ends_line=True)
    assert extractor.points["loss"] == [[4, T0, 0.75], [None, T0 + 3, 2.0]]


def test_a_line_past_the_search_cap_is_searched_in_its_first_part_only() -> None:
    extractor = LogMetricExtractor([LOSS])
    head = "loss=1 " + "y" * (MAX_METRIC_LINE_CHARS - 7)
    extractor.feed(T0, head, ends_line=False)
    extractor.feed(T0, "loss=2 " + "z" * 100, ends_line=True)  # beyond the cap
    extractor.feed(T0, "z" * 100 + "loss=3", ends_line=False)
    extractor.feed(T0, "y" * (MAX_METRIC_LINE_CHARS * 2), ends_line=True)
    assert [p[2] for p in extractor.points["loss"]] == [1.0, 3.0]


def test_skipped_lines_are_counted_and_end_a_line_under_way() -> None:
    extractor = LogMetricExtractor([LOSS])
    extractor.feed(T0, "loss=", ends_line=False)
    extractor.skip(5)
    extractor.feed(T0, "7", ends_line=True)  # not joined with the piece before the gap
    assert extractor.points["loss"] == []
    assert extractor.document(1)["skipped_lines"] == 5


def test_each_metric_keeps_its_share_of_the_cap_and_the_document_says_it_was_cut() -> None:
    assert log_metric_cap(1) == MAX_TENSORBOARD_POINTS
    assert log_metric_cap(32) == MAX_TENSORBOARD_POINTS // 32
    extractor = LogMetricExtractor([LOSS, ACC])
    cap = log_metric_cap(2)
    for i in range(cap + 10):
        extractor.feed(T0 + i, f"step {i} loss={i}")
    extractor.feed(T0, "acc=0.5")  # a chatty metric does not crowd out the others
    assert len(extractor.points["loss"]) == cap
    assert extractor.points["loss"][-1][0] == cap - 1  # the first ones are kept
    assert extractor.points["accuracy"] == [[None, T0, 0.5]]
    document = extractor.document(2)
    assert document["truncated"] is True
    points = parse_log_metrics_document(json.dumps(document).encode())
    assert len(points["loss"]) == cap and points["loss"][0].step == 0


def test_a_regex_re2_refuses_is_left_out_and_named_the_others_run() -> None:
    extractor = LogMetricExtractor([("bad", r"(a)\1"), LOSS, ("look", r"x(?=y)")])
    assert sorted(extractor.refused) == ["bad", "look"]
    assert "backreferences" in extractor.refused["bad"]
    extractor.feed(T0, "aa xy loss=1")
    assert extractor.points == {"bad": [], "loss": [[None, T0, 1.0]], "look": []}


def test_without_a_pattern_set_each_regex_is_searched_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import service.domain.metrics as metrics

    monkeypatch.setattr(metrics, "_pattern_set", lambda regexes: None)
    assert extract(["step 2 loss=0.5 acc 0.9"], [LOSS, ACC]) == {
        "loss": [(0.5, 2)],
        "accuracy": [(0.9, 2)],
    }


@pytest.mark.parametrize(
    "regex",
    [
        r"loss=([0-9.]+)",
        r"^loss=([0-9.]+)",
        r"loss=([0-9.]+)$",
        r"\Aloss=([0-9.]+)",
        r"loss=([0-9.]+)\z",
        r"(?-m)^loss=([0-9.]+)",
        r"(?s)los.=(\d)",
        r"\bloss=([0-9.]+)\b",
        r"loss\s+(\d)",
    ],
)
def test_a_batch_finds_what_its_lines_one_by_one_find(regex: str) -> None:
    """The batch's one search of its lines joined only passes over lines in which nothing
    can match: anchors, whole-text assertions and matches across lines change nothing."""
    lines = ["x loss=1", "loss=2", "loss=3 y", "loss", "4", "loss 5", "", "noise", "loss=6"]
    one_by_one = LogMetricExtractor([("loss", regex)])
    for i, line in enumerate(lines):
        one_by_one.feed(T0 + i, line)
    batched = LogMetricExtractor([("loss", regex)])
    stamps = [T0 + i for i in range(len(lines))]
    for start in (0, 3, 6):
        batched.feed_batch(stamps[start : start + 3], lines[start : start + 3], [True] * 3)
    assert batched.points == one_by_one.points
    assert one_by_one.points["loss"], regex  # each finds something


def test_a_batch_of_only_capped_metrics_or_none_is_passed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extractor = LogMetricExtractor([LOSS, ACC])
    searched: list[str] = []
    feed = extractor.feed
    monkeypatch.setattr(
        extractor, "feed", lambda ts, line, **kw: (searched.append(line), feed(ts, line, **kw))
    )
    cap = extractor.cap
    lines = [f"loss={i}" for i in range(cap)]
    extractor.feed_batch([T0] * cap, lines, [True] * cap)
    assert len(extractor.points["loss"]) == cap and not extractor.truncated
    searched.clear()
    extractor.feed_batch([T0] * 3, ["noise", "more", "none"], [True] * 3)
    extractor.feed_batch([T0] * 2, ["loss=1", "loss=2"], [True] * 2)  # loss is capped
    assert searched == [] and extractor.truncated
    extractor.feed_batch([T0] * 2, ["loss=1", "acc=0.5"], [True] * 2)  # acc can take points
    assert searched == ["loss=1", "acc=0.5"]
    assert extractor.points["accuracy"] == [[None, T0, 0.5]]
    # A piece the tee cut is always fed line by line (it goes on in the next batch).
    searched.clear()
    extractor.feed_batch([T0, T0], ["acc=0.", "7"], [False, True])
    assert searched == ["acc=0.", "7"]
    assert extractor.points["accuracy"][-1] == [None, T0, 0.7]


@pytest.mark.parametrize(
    "data",
    [
        b'{"format": 1, "metrics": {"x": [[1, 2]]}}',
        b'{"format": 1, "metrics": {"x": [["1", 2, 3]]}}',
        b'{"format": 1, "metrics": {"x": [[1, 2, NaN]]}}',
        b'{"format": 1, "metrics": {"x": [[true, 2, 3]]}}',
        b'{"format": 2, "metrics": {}}',
        b'{"format": 1}',
        b"[]",
        b"\xff",
    ],
)
def test_a_document_not_as_the_learner_writes_it_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_log_metrics_document(data)


def test_a_document_holds_null_steps() -> None:
    data = b'{"format": 1, "metrics": {"x": [[null, 2, 3], [4, 5.5, 6]]}}'
    assert [tuple(p) for p in parse_log_metrics_document(data)["x"]] == [
        (None, 2.0, 3.0),
        (4, 5.5, 6.0),
    ]


# -- the tee's pieces -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("buffer", "pieces", "cuts", "rest"),
    [
        (b"a\nb\n", [b"a", b"b"], [], b""),
        (b"a\nb", [b"a"], [], b"b"),
        (b"x" * (MAX_LINE_BYTES + 5), [b"x" * MAX_LINE_BYTES], [0], b"xxxxx"),
        (
            b"a\n" + b"x" * (2 * MAX_LINE_BYTES) + b"\nz\n",
            [b"a", b"x" * MAX_LINE_BYTES, b"x" * MAX_LINE_BYTES, b"z"],
            [1],
            b"",
        ),
        (b"x" * MAX_LINE_BYTES + b"\n", [b"x" * MAX_LINE_BYTES], [], b""),
    ],
)
def test_split_pieces_says_which_pieces_do_not_end_their_line(
    buffer: bytes, pieces: list[bytes], cuts: list[int], rest: bytes
) -> None:
    assert split_pieces(buffer) == (pieces, cuts, rest)


def _run_tee(
    tmp_path: Path, store: LogStore, metrics: LogMetrics, program: str, *, max_bytes: int | None
) -> str:
    training_id = f"test-{uuid.uuid4().hex}"
    tee = LogTee(1, training_id, store, tmp_path / "log.txt", max_bytes=max_bytes, metrics=metrics)
    proc = tee_program(tee, ["-c", program])
    assert proc.wait(timeout=60) == 0
    tee.close(timeout=60)
    return training_id


def test_the_tee_feeds_every_line_it_logs_long_lines_whole(
    tmp_path: Path, log_store: LogStore
) -> None:
    """A metric straddling the tee's cut at MAX_LINE_BYTES is found once; lines past the
    log's cap (and the tee's marker) are not searched."""
    program = (
        "import sys\n"
        "for i in range(1000): print(f'step {i} loss={i}')\n"
        f"print('x' * ({MAX_LINE_BYTES} - 5) + 'loss=4242 step 7')\n"
        "print('acc=0.5 ' + 'y' * 200000 + ' tail')\n"
        "print('loss=99 end')\n"
    )
    metrics = LogMetrics(1, [LOSS, ACC])
    training_id = _run_tee(tmp_path, log_store, metrics, program, max_bytes=None)
    records = list(all_records(log_store, training_id))
    cut = [i for i, r in enumerate(records) if r.line.endswith("xloss=")]
    assert len(cut) == 1 and records[cut[0] + 1].line == "4242 step 7"  # in no record whole
    document = json.loads(metrics.document())
    assert [p[2] for p in document["metrics"]["loss"]] == [*range(1000), 4242, 99]
    assert document["metrics"]["loss"][1000][0] == 7
    assert [p[2] for p in document["metrics"]["accuracy"]] == [0.5]
    assert document["skipped_lines"] == 0

    capped = LogMetrics(1, [LOSS])
    _run_tee(tmp_path, log_store, capped, program, max_bytes=100 * 14)
    values = [p[2] for p in json.loads(capped.document())["metrics"]["loss"]]
    sizes = [len(f"step {i} loss={i}\n") for i in range(1000)]
    fitting = max(n for n in range(1000) if sum(sizes[:n]) <= 100 * 14)
    assert values == list(range(fitting))


def test_feed_never_waits_beyond_its_backlog_it_skips_and_counts() -> None:
    metrics = LogMetrics(1, [LOSS], max_backlog_bytes=100)
    lines = ["loss=1" + " " * 44] * 3  # 150 bytes
    metrics.feed(T0, lines[:1], 50)  # queued: its thread has not started
    metrics.feed(T0, lines, 150)  # over the backlog: skipped
    metrics.feed(T0, lines, 150)
    metrics.start()
    metrics.close(10)
    document = json.loads(metrics.document())
    assert document["skipped_lines"] == 6
    assert [p[2] for p in document["metrics"]["loss"]] == [1.0]


# -- stored with LOG_DIR's syncs ------------------------------------------------------------


def _log_spec(tmp_path: Path, **overrides: Any) -> LearnerSpec:
    return spec(tmp_path, log_metrics=(LOSS,), **overrides)


def test_the_document_is_stored_when_it_changed_and_at_the_end(tmp_path: Path) -> None:
    learner = _log_spec(tmp_path)
    Path(learner.log_dir).mkdir()
    store = CountingStore(tmp_path / "store")
    puts: list[str] = []
    put_stream = store.put_stream

    def counting_put_stream(key: str, *args: Any, **kwargs: Any) -> Any:
        puts.append(key)
        return put_stream(key, *args, **kwargs)

    store.put_stream = counting_put_stream  # type: ignore[method-assign]
    transfers = Transfers(learner, tmp_path / "private", tmp_path / "private" / "log.txt")
    metrics = LogMetrics(1, learner.log_metrics)
    metrics.start()
    sync = LogDirSync(learner, transfers, store, metrics)
    key = keys.log_metrics_key("t1", 1)
    assert key == "trainings/t1/metrics/learner-1/log.json"
    sync.sync()
    assert puts == []  # nothing found yet: nothing stored
    metrics.feed(T0, ["step 1 loss=0.5"], 15)
    deadline = time.monotonic() + 10
    while metrics.version()[0] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    sync.sync()
    sync.sync()  # nothing new: not stored again
    assert puts == [key]
    metrics.feed(T0 + 1, ["step 2 loss=0.25"], 16)
    metrics.close(10)
    sync.stop(last_pass=False)  # a stopped learner still stores its log's metrics
    assert puts == [key, key]
    with store.open(key) as f:
        stored = parse_log_metrics_document(f.read())
    assert [(p.step, p.value) for p in stored["loss"]] == [(1, 0.5), (2, 0.25)]


def test_the_spec_carries_the_metric_definitions(tmp_path: Path) -> None:
    learner = _log_spec(tmp_path)
    assert LearnerSpec.from_dict(json.loads(learner.to_json())).log_metrics == (LOSS,)
    data = json.loads(learner.to_json())
    for bad in ([["loss"]], [["loss", 1]], ["loss"], [[1, 2]]):
        with pytest.raises(ValueError, match="log_metrics"):
            LearnerSpec.from_dict({**data, "log_metrics": bad})
    del data["log_metrics"]  # a spec written before: no metrics
    assert LearnerSpec.from_dict(data).log_metrics == ()


# RE2 takes linear time whatever the pattern: a backtracking matcher would not finish these
# (exponential in the run of a's or x's) on a megabyte. Timed in a subprocess.
_TIMED = """
import sys, time
from service.domain.metrics import LogMetricExtractor
size = int(sys.argv[1])
cases = [("a", "(a+)+$", "a", "b"), ("x", "(x+x+)+y", "x", "z")]
total = 0.0
for name, regex, fill, tail in cases:
    lines = [fill * (64 * 1024 - 1) + tail for _ in range(size // (64 * 1024))]
    for batch in (lines, [fill * (size - 1) + tail]):
        extractor = LogMetricExtractor([(name, regex)])
        start = time.perf_counter()
        for line in batch:
            extractor.feed(0.0, line)
        total += time.perf_counter() - start
        assert extractor.points == {name: []}, extractor.points
print(total)
"""


def _time_catastrophic(size: int) -> float:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TIMED, str(size)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"metric regexes on {size} bytes of output did not finish in 60 s")
    return float(done.stdout)


def test_catastrophic_metric_regexes_run_in_linear_time() -> None:
    small = _time_catastrophic(256 * 1024)
    large = _time_catastrophic(1024 * 1024)
    assert large < 2.0, large
    assert large < 16 * small + 0.2, (small, large)
