"""Every read and write the platform makes in a directory a tenant's code can write.

A learner's RESULT_DIR, LOG_DIR, CHECKPOINT_DIR, MODEL_DIR and DATA_DIR (and a pod's `io`
volume) are written by the tenant's code while the trusted side, outside the sandbox and
holding the store's credentials, reads them. A path checked and then opened again by name
can be swapped in between (a regular file one moment, a link to `$DLAAS_HOME/secret_key`
or `/proc/<pid>/environ` the next), so nothing here opens a tenant path by name:

- a directory is opened once (`O_DIRECTORY | O_NOFOLLOW`), and everything beneath it is
  resolved from that descriptor: with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
  RESOLVE_NO_MAGICLINKS)` where the kernel has it (Linux 5.6), else one component at a
  time with `O_NOFOLLOW` (`O_DIRECTORY` for the directories) from the parent's
  descriptor; either way a symbolic link anywhere on the way fails the open;
- only regular files are taken: a file is opened `O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
  O_NOCTTY | O_CLOEXEC` (a FIFO does not block, a terminal is not acquired), `fstat`ed, and
  skipped unless it is `S_ISREG` with one link (a hard link can name a file outside), and
  unless its name, resolved again, is still that file with that one link (a hard link
  opened, then removed, leaves the file outside one link);
- what is read is bounded by the size `fstat` gave, through the descriptor (`pread`): a
  file that grows while it is read, or a sparse one, cannot make the platform read more,
  and the uploader gets the reader, never a path;
- directories are listed from their descriptors (`os.scandir(fd)`), never by path;
- writes (fetch, restore) create beneath a directory descriptor with `O_CREAT | O_EXCL |
  O_NOFOLLOW` and rename into place there; directories are made with `mkdir(dir_fd=)`.

Standard library only (ctypes for the `openat2` system call).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

# openat2(2): the same number on every Linux architecture (the unified syscall table).
SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1024 * 1024
_MAX_DEPTH = 64  # directories deeper than this are not listed
_TEMP_PREFIX = ".dlaas-write-"


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _openat2(dir_fd: int, relative: str, flags: int, mode: int = 0) -> int:
    how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, _RESOLVE)
    fd = _syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(relative)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), relative)
    return int(fd)


def _kernel_has_openat2() -> bool:
    try:
        root = os.open("/", DIR_FLAGS)
    except OSError:  # pragma: no cover - every Linux has a root
        return False
    try:
        os.close(_openat2(root, ".", DIR_FLAGS))
        return True
    except OSError as e:
        # ENOSYS: no such call; EPERM: a seccomp filter refuses it (some containers).
        if e.errno in (errno.ENOSYS, errno.EPERM):
            return False
        raise
    finally:
        os.close(root)


# Whether paths are resolved with openat2 (the kernel has it) or the component-by-component
# walk. Tests set it to False to run the fallback on a kernel that has openat2.
USE_OPENAT2: bool = _kernel_has_openat2()


def _parts(relative: str) -> list[str]:
    """The components of a relative path; ValueError for an absolute one, `..`, `.`, an
    empty component or a NUL byte (nothing is resolved outside, or ambiguously)."""
    parts = relative.split("/")
    if not relative or "\0" in relative or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{relative!r} is not a plain relative path")
    return parts


def open_beneath(dir_fd: int, relative: str, flags: int, mode: int = 0) -> int:
    """A descriptor of `relative` resolved beneath `dir_fd`, through no symbolic link (nor
    /proc magic link) and never above it; OSError (ELOOP, EXDEV, ENOTDIR, ...) if the path
    crosses one."""
    parts = _parts(relative)
    if USE_OPENAT2:
        return _openat2(dir_fd, relative, flags | os.O_NOFOLLOW, mode)
    current = dir_fd
    try:
        for part in parts[:-1]:
            parent = current
            current = os.open(part, DIR_FLAGS, dir_fd=parent)
            if parent != dir_fd:
                os.close(parent)
        return os.open(parts[-1], flags | os.O_NOFOLLOW, mode, dir_fd=current)
    finally:
        if current != dir_fd:
            os.close(current)


class BoundedReader(io.RawIOBase):
    """Reads `size` bytes at most of an open descriptor, from offset 0, with pread (the
    descriptor's own offset is left alone, so one file gives several readers). Does not
    own the descriptor."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self._size - self._pos)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


FileSignature = tuple[int, int, int, int]  # (device, inode, size, mtime in ns)


class RegularFile:
    """A regular file the platform opened beneath a tenant directory: its descriptor and
    what fstat said of it when it was opened. Close it (or use it as a context)."""

    def __init__(self, fd: int, info: os.stat_result) -> None:
        self.fd = fd
        self.size = info.st_size
        self.signature: FileSignature = (
            info.st_dev,
            info.st_ino,
            info.st_size,
            info.st_mtime_ns,
        )

    def reader(self) -> BinaryIO:
        """A reader of the file's first `size` bytes (what fstat gave when it was opened)."""
        return io.BufferedReader(BoundedReader(self.fd, self.size), _CHUNK)

    def read(self) -> bytes:
        with self.reader() as r:
            return r.read()

    def stream(self) -> BinaryIO:
        """The file read from its descriptor as it grows, for a file the tenant appends to
        while the platform follows it (a pod's output segments, whose reader caps what it
        takes); the descriptor passes to the stream, which closes it."""
        fd, self.fd = self.fd, -1
        return os.fdopen(fd, "rb")

    def current_size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RegularFile:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def regular_file(fd: int) -> RegularFile | None:
    """`fd` as a RegularFile if it is a regular file with one link; else it is closed."""
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        return None
    return RegularFile(fd, info)


class TenantDir:
    """A tenant-writable directory, opened once; every path below it is resolved from its
    descriptor. The directory itself is opened with O_NOFOLLOW: a link in its place is
    refused (FileNotFoundError from `open` when it is missing, NotADirectoryError or an
    ELOOP OSError when it is not a directory)."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, path: Path | str) -> TenantDir:
        return cls(os.open(path, DIR_FLAGS), Path(path))

    @classmethod
    def open_if_dir(cls, path: Path | str) -> TenantDir | None:
        """The directory, or None when it is missing or not a directory of its own."""
        try:
            return cls.open(path)
        except OSError:
            return None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> TenantDir:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------

    def open_file(self, relative: str) -> RegularFile | None:
        """The regular file at `relative`, opened; None for anything else (missing, a link
        on the way, a FIFO, a socket, a device, a directory, a file with more than one
        link, a path that is not plain)."""
        try:
            fd = open_beneath(self.fd, relative, READ_FLAGS)
        except (OSError, ValueError):
            return None
        opened = regular_file(fd)
        if opened is None:
            return None
        # One link when fstat looked, but a hard link could have been opened and removed
        # since (the file outside keeps its own name): the name, resolved again as it was,
        # must still be that file, with that one link. This narrows that window, it does
        # not close it (a lookup and the link count it reports are not one instant); a
        # tenant can only link a file it can name, which the sandbox's view prevents and
        # which, with fs.protected_hardlinks, it could read itself already.
        try:
            name = open_beneath(self.fd, relative, _PATH_FLAGS)
        except OSError:
            opened.close()
            return None
        try:
            info = os.fstat(name)
        finally:
            os.close(name)
        if (info.st_dev, info.st_ino) != opened.signature[:2] or info.st_nlink != 1:
            opened.close()
            return None
        return opened

    def names(self) -> list[str]:
        """The names in the directory itself, listed from its descriptor."""
        return sorted(os.listdir(self.fd))

    def files(self) -> Iterator[str]:
        """The relative paths of the regular files below, in order, listed from directory
        descriptors; links, special files and directories deeper than _MAX_DEPTH are not
        entered or named. A name listed may be something else by the time it is opened:
        `open_file` checks again."""
        yield from self._files(self.fd, "", 0)

    def _files(self, fd: int, prefix: str, depth: int) -> Iterator[str]:
        try:
            with os.scandir(fd) as it:
                entries = sorted(((e.name, e) for e in it), key=lambda pair: pair[0])
        except OSError:
            return
        for name, entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 >= _MAX_DEPTH:
                        continue
                    try:
                        sub = open_beneath(fd, name, DIR_FLAGS)
                    except OSError:
                        continue
                    try:
                        yield from self._files(sub, f"{prefix}{name}/", depth + 1)
                    finally:
                        os.close(sub)
                elif entry.is_file(follow_symlinks=False):
                    yield prefix + name
            except OSError:
                continue

    # -- writing -------------------------------------------------------------------------

    def makedirs(self, relative: str) -> int:
        """The directory `relative` below (made where missing, mode 0755), as a new
        descriptor; OSError if a component is a link or not a directory."""
        current = self.fd
        try:
            for part in _parts(relative):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=current)
                parent = current
                current = os.open(part, DIR_FLAGS, dir_fd=parent)
                if parent != self.fd:
                    os.close(parent)
            return current if current != self.fd else os.dup(self.fd)
        except BaseException:
            if current != self.fd:
                os.close(current)
            raise

    def _parent(self, relative: str) -> tuple[int, str]:
        """A new descriptor of the directory `relative` is in (made where missing) and its
        last component."""
        parts = _parts(relative)
        parent = self.makedirs("/".join(parts[:-1])) if len(parts) > 1 else os.dup(self.fd)
        return parent, parts[-1]

    def create(self, relative: str, mode: int = 0o644) -> BinaryIO:
        """A new file at `relative` (its directories made), for writing: O_CREAT | O_EXCL |
        O_NOFOLLOW, so nothing that is there already (a planted link) is opened.
        FileExistsError if something is."""
        parent, name = self._parent(relative)
        try:
            return os.fdopen(os.open(name, _CREATE_FLAGS, mode, dir_fd=parent), "wb")
        finally:
            os.close(parent)

    def symlink(self, relative: str, target: str) -> None:
        """A symbolic link at `relative` to `target` (never followed here)."""
        parent, name = self._parent(relative)
        try:
            os.symlink(target, name, dir_fd=parent)
        finally:
            os.close(parent)

    def hardlink(self, existing: str, relative: str) -> None:
        """A hard link at `relative` to the file `existing`, both beneath this directory
        (a link at `existing` is linked itself, not followed)."""
        source, source_name = self._parent(existing)
        try:
            parent, name = self._parent(relative)
            try:
                os.link(
                    source_name,
                    name,
                    src_dir_fd=source,
                    dst_dir_fd=parent,
                    follow_symlinks=False,
                )
            finally:
                os.close(parent)
        finally:
            os.close(source)

    def clear(self) -> None:
        """Remove everything in the directory (shutil.rmtree from its descriptor: no link
        is followed)."""
        for name in self.names():
            try:
                os.unlink(name, dir_fd=self.fd)
            except IsADirectoryError:
                shutil.rmtree(name, dir_fd=self.fd)

    def write(self, relative: str, source: BinaryIO, mode: int = 0o644) -> int:
        """`source` into the file `relative` (its directories made), replacing what is
        there: written to a new file beside it (O_CREAT | O_EXCL | O_NOFOLLOW) and renamed
        over it, so a link planted at the name is replaced, never followed. The bytes
        written; ValueError for a path that is not plain, OSError if it cannot be written."""
        parent, name = self._parent(relative)
        try:
            tmp = _TEMP_PREFIX + secrets.token_hex(8)
            fd = os.open(tmp, _CREATE_FLAGS, mode, dir_fd=parent)
            try:
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(source, out, _CHUNK)
                    written = out.tell()
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise
            return written
        finally:
            os.close(parent)


@dataclass(frozen=True)
class FileRef:
    """A file to be read later: `relative` below the directory `root`, reopened beneath
    it each time (no descriptor is held between listing and reading)."""

    root: Path
    relative: str

    def open(self) -> RegularFile | None:
        """The file, opened as TenantDir.open_file does; None if it is not (or no longer)
        a regular file of its own below root."""
        directory = TenantDir.open_if_dir(self.root)
        if directory is None:
            return None
        with directory:
            return directory.open_file(self.relative)


def tree(root: Path | str, prefix: str) -> list[tuple[str, FileRef]]:
    """(key, file) for every regular file below `root`, keys = prefix + relative path;
    nothing when root is missing or is not a directory of its own."""
    directory = TenantDir.open_if_dir(root)
    if directory is None:
        return []
    with directory:
        return [
            (prefix + relative, FileRef(Path(root), relative)) for relative in directory.files()
        ]
