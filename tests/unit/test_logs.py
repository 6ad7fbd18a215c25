"""Log stores (one contract, file and Redis) and reading them a page at a time."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.logs import (
    LogPage,
    LogRecord,
    LogStore,
    open_log_store,
    read_page,
    render_lines,
)
from service.logs.base import LogBlock, blocks_of, records_of
from service.logs.files import (
    FileLogStore,
    _encode,
    _encode_block,
    _parse,
    _parse_lines,
    decode_cursor,
    encode_cursor,
)
from service.logs.redis import RedisLogStore

REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture
def store(log_store: LogStore) -> LogStore:
    """Every log store (tests/unit/conftest.py): one contract."""
    return log_store


@pytest.fixture
def tid(store: LogStore) -> Iterator[str]:
    training_id = f"test-{uuid.uuid4().hex}"
    yield training_id
    store.delete(training_id)


def rec(learner: int, ts: float, line: str | None = None) -> LogRecord:
    return LogRecord(learner, ts, line if line is not None else f"l{learner} t{ts}")


# -- the contract, for every store ------------------------------------------------------------


def test_unknown_training_reads_empty(store: LogStore, tid: str) -> None:
    records, cursor = store.read(tid)
    assert records == []
    assert store.read(tid, cursor) == ([], cursor)


def test_append_then_read_returns_the_records_unchanged(store: LogStore, tid: str) -> None:
    lines = ["plain", "", "  spaces  ", "tab\there", "unicode é ✓ 🚀", '{"json": "like"}', "a\\nb"]
    written = [rec(1, 1000.0 + i / 10, line) for i, line in enumerate(lines)]
    store.append(tid, written)
    records, _ = store.read(tid)
    assert records == written


def test_cursor_continues_after_what_was_read(store: LogStore, tid: str) -> None:
    store.append(tid, [rec(1, 1.0), rec(1, 2.0)])
    first, cursor = store.read(tid)
    assert [r.ts for r in first] == [1.0, 2.0]
    assert store.read(tid, cursor) == ([], cursor)
    store.append(tid, [rec(1, 3.0)])
    second, cursor2 = store.read(tid, cursor)
    assert [r.ts for r in second] == [3.0]
    assert store.read(tid, cursor2)[0] == []
    assert [r.ts for r in store.read(tid)[0]] == [1.0, 2.0, 3.0]  # no cursor: from the start


def test_limit_pages_through_every_record_once(store: LogStore, tid: str) -> None:
    written = [rec(1, float(i)) for i in range(25)]
    store.append(tid, written)
    pages: list[list[LogRecord]] = []
    cursor: str | None = None
    while True:
        page, cursor = store.read(tid, cursor, limit=10)
        if not page:
            break
        pages.append(page)
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [r for p in pages for r in p] == written


def test_learners_are_merged_in_time_order(store: LogStore, tid: str) -> None:
    for r in [rec(1, 1.0), rec(2, 1.5), rec(2, 2.0), rec(1, 2.5), rec(3, 2.7), rec(1, 3.0)]:
        store.append(tid, [r])
    records, _ = store.read(tid)
    assert [(r.learner, r.ts) for r in records] == [
        (1, 1.0),
        (2, 1.5),
        (2, 2.0),
        (1, 2.5),
        (3, 2.7),
        (1, 3.0),
    ]


def test_limit_across_learners_loses_nothing(store: LogStore, tid: str) -> None:
    for r in [rec(1, 1.0), rec(2, 2.0), rec(1, 3.0), rec(2, 4.0), rec(2, 5.0)]:
        store.append(tid, [r])
    page1, cursor = store.read(tid, limit=3)
    assert [r.ts for r in page1] == [1.0, 2.0, 3.0]
    store.append(tid, [rec(1, 6.0)])
    page2, cursor = store.read(tid, cursor, limit=3)
    assert [r.ts for r in page2] == [4.0, 5.0, 6.0]
    assert store.read(tid, cursor)[0] == []


def test_blocks_read_back_as_their_records(store: LogStore, tid: str) -> None:
    """What the log tee sends (a block of lines per read, sharing learner and stamp) reads
    back as the records of its lines, whatever the lines hold."""
    blocks = [
        LogBlock(1, 1.0, ["plain", ",", 'a "quoted", ', "back\\slash\\", ""]),
        LogBlock(2, 2.0, ["é ✓", "\u2028 sep", '{"ts":9,"line":"x"}']),
        LogBlock(1, 3.0, []),
        LogBlock(1, 4.0, ['ends ",', "next"]),
    ]
    store.append_blocks(tid, blocks)
    assert store.read(tid)[0] == records_of(blocks)


def test_blocks_of_records_are_their_runs() -> None:
    records = [rec(1, 1.0, "a"), rec(1, 1.0, "b"), rec(2, 1.0, "c"), rec(1, 2.0, "d")]
    blocks = list(blocks_of(records))
    assert blocks == [
        LogBlock(1, 1.0, ["a", "b"]),
        LogBlock(2, 1.0, ["c"]),
        LogBlock(1, 2.0, ["d"]),
    ]
    assert records_of(blocks) == records
    assert list(blocks_of([])) == []


def test_limit_zero_returns_nothing_and_keeps_the_cursor(store: LogStore, tid: str) -> None:
    store.append(tid, [rec(1, 1.0)])
    records, cursor = store.read(tid, limit=0)
    assert records == []
    assert store.read(tid, cursor)[0] == [rec(1, 1.0)]


@pytest.mark.parametrize("cursor", ["not a cursor!", "1-2-3", "{}", "-1"])
def test_invalid_cursor_is_a_value_error(store: LogStore, tid: str, cursor: str) -> None:
    with pytest.raises(ValueError):
        store.read(tid, cursor)
    with pytest.raises(ValueError):
        store.wait(tid, cursor, 0.01)


def test_wait_returns_at_once_when_records_are_there(store: LogStore, tid: str) -> None:
    store.append(tid, [rec(1, 1.0)])
    started = time.monotonic()
    store.wait(tid, None, 5.0)
    assert time.monotonic() - started < 1.0


def test_wait_times_out_when_nothing_comes(store: LogStore, tid: str) -> None:
    store.append(tid, [rec(1, 1.0)])
    _, cursor = store.read(tid)
    started = time.monotonic()
    store.wait(tid, cursor, 0.2)
    assert 0.15 <= time.monotonic() - started < 1.5
    started = time.monotonic()
    store.wait(tid, cursor, 0)  # a zero timeout never blocks
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("already_started", [False, True])
def test_wait_wakes_up_when_a_record_arrives(
    store: LogStore, tid: str, already_started: bool
) -> None:
    cursor: str | None = None
    if already_started:
        store.append(tid, [rec(1, 1.0)])
        _, cursor = store.read(tid)
    appended_at: list[float] = []

    def append_later() -> None:
        time.sleep(0.2)
        appended_at.append(time.monotonic())
        store.append(tid, [rec(2, 2.0)])

    thread = threading.Thread(target=append_later)
    thread.start()
    store.wait(tid, cursor, 10.0)
    woke = time.monotonic()
    thread.join()
    assert appended_at and woke - appended_at[0] < 0.5
    assert store.read(tid, cursor)[0] == [rec(2, 2.0)]


def test_delete_removes_the_log(store: LogStore, tid: str) -> None:
    store.append(tid, [rec(1, 1.0), rec(2, 2.0)])
    store.delete(tid)
    assert store.read(tid)[0] == []
    store.delete(tid)  # deleting nothing is fine


def test_trainings_are_separate(store: LogStore, tid: str) -> None:
    other = tid + "-other"
    try:
        store.append(tid, [rec(1, 1.0)])
        store.append(other, [rec(1, 2.0)])
        assert store.read(tid)[0] == [rec(1, 1.0)]
        assert store.read(other)[0] == [rec(1, 2.0)]
    finally:
        store.delete(other)


# -- the file store's own rules ---------------------------------------------------------------


def test_file_layout_is_one_jsonl_per_learner(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path)
    store.append("t1", [rec(1, 1.0, "a"), rec(2, 1.5, "b"), rec(1, 2.0, "c")])
    assert sorted(p.name for p in (tmp_path / "t1").iterdir()) == [
        "learner-1.jsonl",
        "learner-2.jsonl",
    ]
    lines = (tmp_path / "t1" / "learner-1.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"ts": 1.0, "line": "a"},
        {"ts": 2.0, "line": "c"},
    ]


def test_file_store_reads_lines_json_wrote(tmp_path: Path) -> None:
    """Logs written before the store wrote with orjson (json.dumps' spacing) read the same."""
    (tmp_path / "t1").mkdir()
    (tmp_path / "t1" / "learner-1.jsonl").write_text(
        '{"ts": 1.5, "line": "old \\u00e9"}\n{"ts": 2.0, "line": "\u00e9 \u2713"}\n'
    )
    assert FileLogStore(tmp_path).read("t1")[0] == [rec(1, 1.5, "old é"), rec(1, 2.0, "é ✓")]


def test_file_store_keeps_a_line_orjson_refuses(tmp_path: Path) -> None:
    """A lone surrogate (not UTF-8, so orjson refuses it) is written by json and read back
    unchanged, between lines orjson wrote."""
    store = FileLogStore(tmp_path)
    written = [rec(1, 1.0, "before"), rec(1, 2.0, "lone \udc80 surrogate"), rec(1, 3.0, "after")]
    store.append("t1", written)
    assert store.read("t1")[0] == written


def test_file_store_merges_one_batch_of_several_learners_by_time(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path)
    store.append("t1", [rec(1, 1.0), rec(1, 3.0), rec(2, 2.0)])
    assert [r.ts for r in store.read("t1")[0]] == [1.0, 2.0, 3.0]


def test_file_store_never_returns_a_partial_line(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path)
    store.append("t1", [rec(1, 1.0, "whole")])
    path = tmp_path / "t1" / "learner-1.jsonl"
    with path.open("ab") as f:
        f.write(b'{"ts": 2.0, "li')
    records, cursor = store.read("t1")
    assert records == [rec(1, 1.0, "whole")]
    started = time.monotonic()
    store.wait("t1", cursor, 0.2)  # a line in the making is not a reason to wake up
    assert time.monotonic() - started >= 0.15
    with path.open("ab") as f:
        f.write(b'ne": "done"}\n')
    store.wait("t1", cursor, 5.0)
    assert store.read("t1", cursor)[0] == [rec(1, 2.0, "done")]


def test_file_store_returns_a_corrupt_line_as_text_and_moves_past_it(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path)
    store.append("t1", [rec(1, 5.0, "before")])
    with (tmp_path / "t1" / "learner-1.jsonl").open("ab") as f:
        f.write(b"garbage\n")
    records, cursor = store.read("t1")
    assert records == [rec(1, 5.0, "before"), rec(1, 5.0, "garbage")]
    assert store.read("t1", cursor)[0] == []


TRICKY_LINES = [
    [","],
    ["a", ","],
    [",", "b"],
    ['x",', "y"],
    ['x","y'],
    ['",",","'],
    ["\\", "\\\\"],
    ['a\\",', "b"],
    ["", ""],
    ["lone \udc80 surrogate", "after"],
    ["é", "\u2028", "\x00", "\n inside"],
]


@pytest.mark.parametrize("lines", TRICKY_LINES)
def test_a_block_is_stored_as_its_lines_one_by_one(lines: list[str]) -> None:
    """A block is encoded in one call (its lines' JSON list, cut at the separators), byte
    for byte as each of its lines alone; where a line could fake a separator (one ending
    with a comma) or orjson refuses one, line by line."""
    for ts in (1.0, 1764270000.123456, 3):
        expected = b"".join(_encode(ts, line) for line in lines)
        assert _encode_block(LogBlock(1, ts, lines)) == expected


def test_random_blocks_are_stored_as_their_lines_one_by_one() -> None:
    alphabet = ['"', ",", "\\", "a", "\n", "é", "}", "{", " ", "\t"]
    chooser = random.Random(7)
    for _ in range(5000):
        lines = [
            "".join(chooser.choice(alphabet) for _ in range(chooser.randint(0, 6)))
            for _ in range(chooser.randint(1, 5))
        ]
        expected = b"".join(_encode(1.5, line) for line in lines)
        assert _encode_block(LogBlock(1, 1.5, lines)) == expected, lines


@pytest.mark.parametrize(
    "lines",
    [
        [b'{"ts":1,"line":"a"}', b'{"ts":2.5,"line":"b"}'],
        [b'{"ts":1,"line":"a"}', b"garbage", b'{"ts":3,"line":"c"}'],
        [b'{"ts":1,"line":"a"},{"ts":2,"line":"b"}', b'{"ts":3,"line":"c"}'],
        [b'{"ts":"2","line":3}', b'{"line":"no stamp"}', b"[]", b"", b"7"],
        [b'{"ts": 1.5, "line": "json\'s spacing \\u00e9"}'],
        [b'{"ts":1,"line":"lone \xed\xb2\x80 surrogate"}'],
    ],
)
def test_a_read_parses_its_lines_as_each_alone(lines: list[bytes]) -> None:
    """A read's lines are parsed by one call; the records are those of each line alone
    (a line that is not a record: its text, at the stamp before it)."""
    expected = []
    last_ts = 0.0
    for raw in lines:
        expected.append(_parse(1, raw, last_ts))
        last_ts = expected[-1].ts
    assert _parse_lines(1, lines, 0.0) == expected


def test_file_store_ignores_other_files_and_refuses_unsafe_ids(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path)
    store.append("t1", [rec(1, 1.0)])
    (tmp_path / "t1" / "notes.txt").write_text("not a log\n")
    assert store.read("t1")[0] == [rec(1, 1.0)]
    for bad in ["", ".", "..", "a/b"]:
        with pytest.raises(ValueError):
            store.read(bad)


def test_rendered_lines_are_each_records_render() -> None:
    """render_lines formats a time stamp once for the records that share it; the text is
    the same as each kept record's render()."""
    records = [
        rec(1, 1000.25, "a"),
        rec(1, 1000.25, "b é"),
        rec(2, 1000.25, "other learner"),
        rec(1, 1001.5, "later"),
        rec(1, 1000.25, "the first stamp again"),
    ]
    keep = lambda r: r.line != "b é"  # noqa: E731
    expected = "".join(r.render() + "\n" for r in records if keep(r)).encode()
    assert render_lines(records, keep) == expected
    assert render_lines([], keep) == b""
    every = "".join(r.render() + "\n" for r in records).encode()
    assert render_lines(records) == every


def test_file_cursor_round_trips() -> None:
    assert decode_cursor(encode_cursor({1: 10, 12: 0})) == {1: 10, 12: 0}
    assert decode_cursor(None) == {} == decode_cursor("")
    for bad in [encode_cursor({1: 1})[:-3] + "!!", "W10", "eyIxIjogLTF9"]:  # [], {"1": -1}
        with pytest.raises(ValueError):
            decode_cursor(bad)


def test_open_log_store_picks_the_kind(tmp_path: Path) -> None:
    assert isinstance(open_log_store("file", dir=str(tmp_path)), FileLogStore)
    assert isinstance(open_log_store("redis", url=REDIS_URL), RedisLogStore)  # connects lazily
    with pytest.raises(ValueError, match="directory"):
        open_log_store("file")
    with pytest.raises(ValueError, match="URL"):
        open_log_store("redis")
    with pytest.raises(ValueError, match="unknown"):
        open_log_store("kafka", dir=str(tmp_path))


T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


# -- pages ------------------------------------------------------------------------------------


def _keep_all(record: LogRecord) -> bool:
    return True


def _pages(
    store: LogStore, tid: str, *, max_bytes: int, max_records: int = 1_000_000, keep: Any = None
) -> list[LogPage]:
    pages: list[LogPage] = []
    cursor: str | None = None
    while True:
        page = read_page(
            store,
            tid,
            cursor,
            keep=keep or _keep_all,
            max_bytes=max_bytes,
            max_records=max_records,
        )
        pages.append(page)
        cursor = page.cursor
        if not page.more:
            return pages
        assert len(pages) < 1000


def test_pages_hold_every_line_once_within_the_byte_cap(store: LogStore, tid: str) -> None:
    # Two learners, interleaved in time, lines of varied sizes, more than a read batch.
    records = [rec(1 + i % 2, T0 + i, f"line {i} " + "x" * (i % 97)) for i in range(700)]
    store.append(tid, records)
    expected = [(r.render() + "\n").encode() for r in records]
    pages = _pages(store, tid, max_bytes=4096)
    assert all(len(p.text) <= 4096 for p in pages)
    assert all(p.more for p in pages[:-1]) and not pages[-1].more
    assert b"".join(p.text for p in pages) == b"".join(expected)
    assert len(pages) >= sum(map(len, expected)) // 4096


def test_a_page_continues_exactly_after_the_cut(store: LogStore, tid: str) -> None:
    store.append(tid, [rec(1, T0 + i, f"{i:03d}" + "y" * 96) for i in range(10)])
    line = len(rec(1, T0, "000" + "y" * 96).render()) + 1
    first = read_page(store, tid, None, keep=_keep_all, max_bytes=3 * line + 5, max_records=100)
    assert first.more and first.text.count(b"\n") == 3
    rest = read_page(store, tid, first.cursor, keep=_keep_all, max_bytes=10**6, max_records=100)
    assert not rest.more
    assert [ln.split(b"] ")[1][:3] for ln in rest.text.splitlines()] == [
        f"{i:03d}".encode() for i in range(3, 10)
    ]


def test_a_line_longer_than_the_cap_is_a_page_of_its_own(store: LogStore, tid: str) -> None:
    store.append(tid, [rec(1, T0, "a" * 5000), rec(1, T0 + 1, "b")])
    pages = _pages(store, tid, max_bytes=100)
    assert [p.text.count(b"\n") for p in pages] == [1, 1]
    assert b"a" * 5000 in pages[0].text


def test_filtered_pages_and_the_record_cap(store: LogStore, tid: str) -> None:
    store.append(tid, [rec(1 + i % 4, T0 + i, f"n{i}") for i in range(600)])

    def learner_4(r: LogRecord) -> bool:
        return r.learner == 4

    pages = _pages(store, tid, max_bytes=10**6, max_records=50, keep=learner_4)
    lines = b"".join(p.text for p in pages).splitlines()
    assert [ln.rsplit(b" ", 1)[1] for ln in lines] == [f"n{i}".encode() for i in range(3, 600, 4)]
    assert len(pages) == 13  # 600 records, 50 looked at per page, and the empty end
    assert pages[-1].text == b"" and not pages[-1].more


def test_a_page_of_an_empty_log_is_empty(store: LogStore, tid: str) -> None:
    page = read_page(store, tid, None, keep=_keep_all, max_bytes=100, max_records=100)
    assert page.text == b"" and not page.more
    with pytest.raises(ValueError):
        read_page(store, tid, "not a cursor!", keep=_keep_all, max_bytes=100, max_records=100)


def test_redis_sends_a_block_s_learner_and_stamp_once() -> None:
    """The tee's blocks reach Redis as one script call whose arguments are each block's
    learner, stamp and line count, then its lines: one argument to encode a line, not three
    (a third of the learner's CPU on a fast printer)."""
    store = RedisLogStore(REDIS_URL)
    tid = f"test-{uuid.uuid4().hex}"
    sent: list[list[object]] = []
    script = store._append

    def counting(keys: list[str], args: list[object]) -> object:
        sent.append(args)
        return script(keys=keys, args=args)

    store._append = counting  # type: ignore[assignment,method-assign]
    blocks = [LogBlock(1, 1.0, ["a", "b", "c"]), LogBlock(2, 2.0, []), LogBlock(1, 3.0, ["d"])]
    try:
        store.append_blocks(tid, blocks)
        assert len(sent) == 1 and len(sent[0]) == 1 + 3 * 2 + 4
        assert store.read(tid)[0] == records_of(blocks)
    finally:
        store.delete(tid)
        store.close()
