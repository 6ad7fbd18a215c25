"""What a learner pod's `run` step and its `agent` share in the `io` volume: the command's
output as numbered segment files, then an `exit` file, and the agent's `stored` answer.

Standard library only: the `run` step imports this in the runtime's image, where nothing
of the platform's dependencies is installed.

- `output-000000`, `output-000001`, ...: the command's output (stdout and stderr, as
  written, partial last line included), appended by `run`. `run` starts the next segment
  only when the current one has reached its size, so once a next segment exists the
  current one is complete and the agent deletes it after reading it: the volume holds
  about one segment however long the log.
- `exit`: written atomically by `run` after the last output byte, `{"code", "stopped"}`:
  the container's exit code to be, and whether the command was stopped (SIGTERM).
- `stored`: written atomically by the agent once it has stored what it had to,
  `{"ok", "reason"}`.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

SEGMENT_PREFIX = "output-"
SEGMENT_BYTES = 64 * 1024 * 1024
EXIT_FILE = "exit"
STORED_FILE = "stored"
# The pod's terminationMessagePath; the kubelet keeps at most 4096 bytes of it.
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MAX_BYTES = 4096
POLL_SECONDS = 0.05
_CHUNK = 64 * 1024
_SMALL_FILE_BYTES = 16 * 1024  # exit and stored hold a few bytes


def segment_path(io_dir: Path, index: int) -> Path:
    return io_dir / segment_name(index)


def segment_name(index: int) -> str:
    return f"{SEGMENT_PREFIX}{index:06d}"


def segment_indexes(names: list[str]) -> list[int]:
    """The numbers of the segments among the names of the `io` directory, in order."""
    numbers = (n[len(SEGMENT_PREFIX) :] for n in names if n.startswith(SEGMENT_PREFIX))
    return sorted(int(n) for n in numbers if n.isdigit())


class IoReader(Protocol):
    """How a side reads the `io` directory. The agent, which holds the spec and the store's
    credentials, reads it through worker.learner.pod_steps.AgentIo (service.tenantfs:
    from the directory's descriptor, no link followed); `run`, the tenant's own side in
    the runtime's image, through PathIo."""

    def names(self) -> list[str]:
        """The names in the directory."""
        ...

    def open(self, name: str) -> BinaryIO:
        """The regular file `name` opened for reading; FileNotFoundError if there is none,
        ValueError for anything else than a regular file."""
        ...


class PathIo:
    """The `run` step's reader (it runs as the tenant: standard library, by path)."""

    def __init__(self, io_dir: Path) -> None:
        self.io_dir = io_dir

    def names(self) -> list[str]:
        return os.listdir(self.io_dir)

    def open(self, name: str) -> BinaryIO:
        return open_regular(self.io_dir / name)


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` with `data` at once: a reader sees the whole file or none."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file, never through a symbolic link:
    the learner container writes in `io`, and a link there to a file only the agent can
    see (the spec, with the credentials) must not have the agent read it into the log.
    Raises FileNotFoundError, or ValueError for anything else than a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{path} cannot be opened as a regular file: {e.strerror}") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def _read_json(reader: IoReader, io_dir: Path, name: str) -> dict[str, Any] | None:
    """The small JSON object in the file `name`, None if there is none. ValueError for a
    file its writer did not write (its content is not repeated: it may not be ours to
    show)."""
    path = io_dir / name
    try:
        with reader.open(name) as f:
            data = json.loads(f.read(_SMALL_FILE_BYTES + 1)[:_SMALL_FILE_BYTES])
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not what its writer writes") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


@dataclass(frozen=True)
class Exit:
    """How the command ended: `code` is the learner container's exit code (128 + N when
    signal N killed the command); `stopped`: it was stopped (the pod is being deleted)."""

    code: int
    stopped: bool = False

    def write(self, io_dir: Path) -> None:
        write_json_atomically(io_dir / EXIT_FILE, {"code": self.code, "stopped": self.stopped})

    @classmethod
    def read(cls, io_dir: Path, reader: IoReader | None = None) -> Exit | None:
        """The exit, or None while the command runs. Raises ValueError for a file `run`
        did not write (the learner container is the user's: its files are untrusted)."""
        data = _read_json(reader or PathIo(io_dir), io_dir, EXIT_FILE)
        if data is None:
            return None
        code, stopped = data.get("code"), data.get("stopped", False)
        if type(code) is not int or type(stopped) is not bool:
            raise ValueError(f"{io_dir / EXIT_FILE} is not what its writer writes")
        return cls(code, stopped)


@dataclass(frozen=True)
class Stored:
    """The agent's answer: whether the results and logs were stored, and if not why."""

    ok: bool
    reason: str | None = None

    def write(self, io_dir: Path) -> None:
        write_json_atomically(io_dir / STORED_FILE, {"ok": self.ok, "reason": self.reason})

    @classmethod
    def read(cls, io_dir: Path, reader: IoReader | None = None) -> Stored | None:
        data = _read_json(reader or PathIo(io_dir), io_dir, STORED_FILE)
        if data is None:
            return None
        ok, reason = data.get("ok"), data.get("reason")
        if type(ok) is not bool or not (reason is None or isinstance(reason, str)):
            raise ValueError(f"{io_dir / STORED_FILE} is not what its writer writes")
        return cls(ok, reason)


def write_termination_message(path: str, message: str) -> None:
    """Leave `message` where the kubelet reads the container's termination message (the
    pod's status shows it). Best effort: outside a pod there may be no such file."""
    data = message.encode("utf-8", "replace")[:TERMINATION_MAX_BYTES]
    with contextlib.suppress(OSError), open(path, "wb") as f:
        f.write(data)


class SegmentWriter:
    """The `run` side: appends output to the current segment, starting the next one once
    the current one holds `segment_bytes`."""

    def __init__(self, io_dir: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.io_dir = io_dir
        self.segment_bytes = segment_bytes
        self.index = 0
        self.size = 0
        io_dir.mkdir(parents=True, exist_ok=True)
        self.fd = self._open()

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        return os.open(segment_path(self.io_dir, self.index), flags, 0o640)

    def write(self, data: bytes) -> None:
        if self.size and self.size + len(data) > self.segment_bytes:
            os.close(self.fd)
            self.index += 1
            self.size = 0
            self.fd = self._open()
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
            self.size += written

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def follow(
    io_dir: Path,
    sink: Callable[[bytes], None],
    *,
    stop: Callable[[], bool],
    poll: float = POLL_SECONDS,
    reader: IoReader | None = None,
) -> None:
    """The agent side: hand every byte of the output segments, in order, to `sink`, until
    the exit file exists (or `stop()` is true) and everything written before it has been
    handed over. Survives the segments not existing yet; deletes each segment it has read
    once `run` has moved on to the next. ValueError for a segment that is not a regular
    file (see IoReader.open). `reader` reads the directory (by path, PathIo, if not
    given)."""
    reader = reader or PathIo(io_dir)
    index = 0
    current: BinaryIO | None = None
    try:
        while True:
            names = reader.names()
            # Decided before reading: `run` writes the exit file after its last output,
            # so reading to the end after seeing it misses nothing.
            finished = EXIT_FILE in names or stop()
            if current is None:
                # The first present: an agent restarted by the kubelet finds the segments
                # before it deleted.
                index = min((i for i in segment_indexes(names) if i >= index), default=index)
                try:
                    current = reader.open(segment_name(index))
                except FileNotFoundError:
                    if finished:
                        return
                    time.sleep(poll)
                    continue
            chunk = current.read(_CHUNK)
            if chunk:
                sink(chunk)
                continue
            if segment_name(index + 1) in reader.names():
                # Complete: `run` starts the next segment only after its last write here.
                while chunk := current.read(_CHUNK):
                    sink(chunk)
                current.close()
                current = None
                # unlink removes the name itself, never what a link there points to.
                (io_dir / segment_name(index)).unlink(missing_ok=True)
                index += 1
                continue
            if finished:
                return
            time.sleep(poll)
    finally:
        if current is not None:
            current.close()
