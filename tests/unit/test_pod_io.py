"""What a learner pod's run step and agent share in the io volume (worker.learner.pod_io),
and what run knows of the pod's layout without importing it."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from worker.backends.kubernetes import layout
from worker.learner import pod_io, pod_run
from worker.learner.pod import main, parse


def test_run_and_the_pod_layout_agree_on_the_key_pair() -> None:
    # pod_run cannot import layout (the runtime's image has none of its imports).
    assert pod_run.SSH_DIR == layout.SSH_DIR
    assert pod_run.SSH_KEY_NAMES == layout.SSH_KEY_NAMES


def test_the_commands_of_the_pod_layout_are_pod_steps() -> None:
    for learner in (1, 3):
        for command in (layout.fetch_command(learner), layout.agent_command(learner)):
            # Isolated (-I): nothing of the tenant's on the step's import path.
            assert command[:4] == ["python", "-I", "-m", "worker.learner.pod"]
            ns, argv = parse(command[4:])
            assert ns.spec == Path(layout.SPEC_DIR, layout.spec_file(learner))
            assert argv == []
        assert parse(layout.agent_command(learner)[4:])[0].io == Path(layout.IO_DIR)
    run = layout.run_command(["python", "train.py", "--", "x"], ("h-1:2222", "h-2:2022"))
    assert run[:4] == ["python", "-I", "-m", "worker.learner.pod"]
    ns, argv = parse(run[4:])
    assert (ns.step, ns.io, ns.wait_for) == ("run", Path(layout.IO_DIR), ["h-1:2222", "h-2:2022"])
    assert argv == ["python", "train.py", "--", "x"]
    ns, argv = parse(layout.run_command(layout.sshd_argv())[4:])
    assert argv == list(layout.sshd_argv())


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--io", "/io", "--bogus", "--", "true"],
        ["run", "--io", "/io", "--wait-for", "no-port", "--", "true"],
        ["run", "--io", "/io"],
        ["run", "--io", "/io", "--"],
        ["run", "--", "true"],
        ["agent", "/spec.json"],
        ["nonsense"],
    ],
)
def test_a_wrong_step_is_a_usage_error(args: list[str]) -> None:
    assert main(args) == 2


def collect(io_dir: Path, stop: threading.Event) -> tuple[threading.Thread, bytearray]:
    out = bytearray()
    thread = threading.Thread(
        target=pod_io.follow, args=(io_dir, out.extend), kwargs={"stop": stop.is_set, "poll": 0.01}
    )
    thread.start()
    return thread, out


def test_follow_waits_for_the_output_and_reads_every_segment_in_order(tmp_path: Path) -> None:
    stop = threading.Event()
    thread, out = collect(tmp_path, stop)
    time.sleep(0.05)  # nothing written yet: it waits
    assert thread.is_alive()
    writer = pod_io.SegmentWriter(tmp_path, segment_bytes=10)
    expected = b""
    for i in range(50):
        chunk = f"line {i}\n".encode() if i % 3 else f"part {i} ".encode()
        writer.write(chunk)
        expected += chunk
        if i % 7 == 0:
            time.sleep(0.01)
    writer.close()
    assert thread.is_alive()
    pod_io.Exit(0).write(tmp_path)
    thread.join(5)
    assert not thread.is_alive()
    assert bytes(out) == expected
    # Every segment read before the writer moved on is gone.
    assert [p.name for p in tmp_path.glob("output-*")] == [f"output-{writer.index:06d}"]


def test_follow_stops_when_asked_after_reading_what_is_there(tmp_path: Path) -> None:
    writer = pod_io.SegmentWriter(tmp_path)
    writer.write(b"first\nsecond, unfinished")
    stop = threading.Event()
    thread, out = collect(tmp_path, stop)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert bytes(out) == b"first\nsecond, unfinished"


@pytest.mark.parametrize(
    "text", ['{"code": "3"}', '{"code": 3, "stopped": 1}', "[3]", '{"code": 3', '{"code": true}']
)
def test_an_exit_file_run_did_not_write_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / pod_io.EXIT_FILE).write_text(text)
    with pytest.raises(ValueError):
        pod_io.Exit.read(tmp_path)


def test_exit_and_stored_round_trip(tmp_path: Path) -> None:
    assert pod_io.Exit.read(tmp_path) is None and pod_io.Stored.read(tmp_path) is None
    pod_io.Exit(137, stopped=True).write(tmp_path)
    pod_io.Stored(False, "the store is down").write(tmp_path)
    assert pod_io.Exit.read(tmp_path) == pod_io.Exit(137, stopped=True)
    assert pod_io.Stored.read(tmp_path) == pod_io.Stored(False, "the store is down")
    assert json.loads((tmp_path / pod_io.STORED_FILE).read_text())["ok"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == [pod_io.EXIT_FILE, pod_io.STORED_FILE]


def test_the_termination_message_is_capped_and_never_fails(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    pod_io.write_termination_message(str(path), "x" * 10_000)
    assert path.read_bytes() == b"x" * pod_io.TERMINATION_MAX_BYTES
    pod_io.write_termination_message(str(tmp_path / "missing" / "log"), "nowhere to go")


@pytest.mark.parametrize(
    ("returncode", "code"), [(0, 0), (3, 3), (-15, 143), (-9, 137), (255, 255)]
)
def test_a_signal_is_128_plus_its_number(returncode: int, code: int) -> None:
    assert pod_run.exit_code(returncode) == code


@pytest.mark.parametrize(
    ("endpoint", "parsed"),
    [("h-1:2222", ("h-1", 2222)), ("a.b.c:22", ("a.b.c", 22)), ("[::1]:80", ("::1", 80))],
)
def test_endpoints_parse(endpoint: str, parsed: tuple[str, int]) -> None:
    assert pod_run.parse_endpoint(endpoint) == parsed


@pytest.mark.parametrize("endpoint", ["h-1", ":22", "h:0", "h:70000", "h:x"])
def test_bad_endpoints_are_refused(endpoint: str) -> None:
    with pytest.raises(ValueError):
        pod_run.parse_endpoint(endpoint)


def test_a_restarted_follower_starts_at_the_first_segment_left(tmp_path: Path) -> None:
    writer = pod_io.SegmentWriter(tmp_path, segment_bytes=4)
    for word in (b"aaaa", b"bbbb", b"cccc", b"dd"):
        writer.write(word)
    writer.close()
    for i in (0, 1):  # read and deleted before the restart
        pod_io.segment_path(tmp_path, i).unlink()
    pod_io.Exit(0).write(tmp_path)
    out = bytearray()
    pod_io.follow(tmp_path, out.extend, stop=lambda: False, poll=0.01)
    assert bytes(out) == b"ccccdd"


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_the_follower_reads_nothing_but_regular_files(tmp_path: Path, kind: str) -> None:
    # The learner container writes in io: a link there to a file the agent sees (its spec,
    # with the credentials) must not end up in the log, a FIFO must not block it.
    secret = tmp_path / "spec.json"
    secret.write_text('{"secret_key": "s3cr3t"}')
    io_dir = tmp_path / "io"
    io_dir.mkdir()
    segment = pod_io.segment_path(io_dir, 0)
    if kind == "symlink":
        segment.symlink_to(secret)
    elif kind == "fifo":
        os.mkfifo(segment)
    else:
        segment.mkdir()
    out = bytearray()
    with pytest.raises(ValueError, match="regular file"):
        pod_io.follow(io_dir, out.extend, stop=lambda: False, poll=0.01)
    assert out == b""


def test_an_exit_file_that_is_a_link_is_refused_without_its_content(tmp_path: Path) -> None:
    secret = tmp_path / "spec.json"
    secret.write_text('{"code": 0, "secret_key": "s3cr3t"}')
    io_dir = tmp_path / "io"
    io_dir.mkdir()
    (io_dir / pod_io.EXIT_FILE).symlink_to(secret)
    with pytest.raises(ValueError) as error:
        pod_io.Exit.read(io_dir)
    assert "s3cr3t" not in str(error.value) and "s3cr3t" not in str(error.value.__cause__)
