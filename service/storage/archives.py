"""Check and safely extract user-uploaded model_definition archives (.zip or .tar.gz).

File modes: a regular file is written 0o755 when the archive gives its owner the execute
bit (a zip's Unix mode in `external_attr`, a tar member's mode), else 0o644, exactly
(whatever the process's umask), so `./launcher.py` runs as the user packed it. Nothing
else of the archive's mode is kept: never set-uid, set-gid or sticky, never group or other
write (`restored_mode`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gzip
import os
import re
import stat
import tarfile
import zipfile
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from service.tenantfs import TenantDir

Format = Literal["zip", "tar.gz"]
# An archive on disk, or an open seekable file holding one (read from its start; left open).
Source = Path | IO[bytes]
_Kind = Literal["file", "dir", "symlink", "hardlink"]

_CHUNK = 1024 * 1024
_MAX_LINK_TARGET = 4096
_MAX_TAR_TRAILER = 1024 * 1024  # tar pads to 10 KiB records; far more than that is not padding
# Members smaller than this cannot be bombs, while small repetitive files (padding, empty
# tables) legitimately compress beyond any ratio; only larger members get the ratio check.
_RATIO_FLOOR = 1024 * 1024
_DRIVE = re.compile(r"^[A-Za-z]:")
_NOT_ARCHIVE = "model_definition must be a .zip or .tar.gz archive"
_UNREADABLE = "model_definition is not a readable .zip or .tar.gz archive"
_ZIP_KINDS: dict[int, _Kind] = {
    0: "file",  # archivers on other systems leave the Unix mode empty
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "symlink",
}
_TAR_KINDS: dict[bytes, _Kind] = {
    tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
}


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps applied to an archive before and while it is unpacked."""

    max_files: int = 10_000  # regular files + dirs + links counted as entries
    max_unpacked_bytes: int = 1024**3  # sum of uncompressed sizes
    max_compression_ratio: float = 200.0  # zip members: file_size / max(compress_size, 1)


@dataclass(frozen=True)
class ArchiveSummary:
    """What an accepted archive holds."""

    format: Format
    entries: int
    unpacked_bytes: int


class UnsafeArchiveError(ValueError):
    """The archive is not acceptable; str(err) is a sentence a user can act on."""


def _refuse(member: str, problem: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"archive entry {member!r} {problem}")


@dataclass(frozen=True)
class _Entry:
    member: str  # the name as written in the archive, for messages
    name: str  # normalized, "/"-separated, relative to the root ("" is the root itself)
    kind: _Kind
    mode: int  # the mode the archive gives the member (permission bits)
    link: str  # symlink: target to write; hard link: normalized name of the linked file
    open: Callable[[], IO[bytes] | None] | None


@contextlib.contextmanager
def _reading() -> Iterator[None]:
    # Parsers raise a zoo of types on hostile input (BadZipFile, EOFError, zlib.error,
    # struct.error, ...); callers must see exactly one.
    try:
        yield
    except UnsafeArchiveError:
        raise
    except Exception as exc:
        raise UnsafeArchiveError(f"{_UNREADABLE}: {exc}") from exc


def _chunks(read: Callable[[int], bytes]) -> Iterator[bytes]:
    while True:
        with _reading():
            chunk = read(_CHUNK)
        if not chunk:
            return
        yield chunk


def _is_absolute(path: str) -> bool:
    return path.startswith(("/", "\\")) or _DRIVE.match(path) is not None


def _resolve(base: str, path: str, *, strict: bool = False) -> str | None:
    """Join path onto base lexically ('\\' counts as '/'); None if it leaves the root.

    strict refuses '..' after a name: through an archive symlink such a step lands somewhere
    else than it reads, so link targets may only climb before they descend.
    """
    parts = [p for p in base.split("/") if p]
    named = False
    for part in path.replace("\\", "/").split("/"):
        if part not in ("", ".", ".."):
            parts.append(part)
            named = True
        elif part == ".." and (not parts or (strict and named)):
            return None
        elif part == "..":
            parts.pop()
    return "/".join(parts)


class _Checker:
    """Applies every rule to entries in archive order and keeps the running totals."""

    def __init__(self, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.entries = 0
        self.unpacked = 0
        self.kinds: dict[str, _Kind] = {"": "dir"}

    def add(self, member: str, kind: _Kind, size: int, link: str = "") -> tuple[str, str]:
        """Validate one entry; return its normalized name and the link to create."""
        self.entries += 1
        if self.entries > self.limits.max_files:
            raise _refuse(member, f"is over the limit of {self.limits.max_files} entries")
        if "\0" in member or "\0" in link:
            raise _refuse(member, "has a NUL byte in its name or link target")
        if _is_absolute(member):
            raise _refuse(member, "has an absolute path; use paths relative to the archive root")
        name = _resolve("", member)
        if name is None:
            raise _refuse(member, "escapes the archive root")
        if not name and kind != "dir":
            raise _refuse(member, "has an empty name")
        parts = name.split("/")
        for i in range(1, len(parts)):
            ancestor = "/".join(parts[:i])
            seen = self.kinds.setdefault(ancestor, "dir")
            if seen == "symlink":
                raise _refuse(member, f"is written through the symbolic link {ancestor!r}")
            if seen != "dir":
                raise _refuse(member, f"is inside {ancestor!r}, which is a file")
        if name in self.kinds and (kind != "dir" or self.kinds[name] != "dir"):
            raise _refuse(member, "appears more than once")
        self.kinds[name] = "file" if kind == "hardlink" else kind
        self.unpacked += size
        if self.unpacked > self.limits.max_unpacked_bytes:
            raise self.too_big(member)
        if kind not in ("symlink", "hardlink"):
            return name, ""
        # Symlinks resolve from their own directory, tar hard links from the root.
        base = name.rpartition("/")[0] if kind == "symlink" else ""
        target = None if _is_absolute(link) else _resolve(base, link, strict=True)
        if not link or target is None:
            raise _refuse(member, f"links to {link!r}, outside the archive root")
        if kind == "hardlink" and self.kinds.get(target) != "file":
            raise _refuse(member, f"is a hard link to {link!r}, which is not an earlier file")
        return name, target if kind == "hardlink" else link.replace("\\", "/")

    def too_big(self, member: str) -> UnsafeArchiveError:
        cap = self.limits.max_unpacked_bytes
        return _refuse(member, f"takes the unpacked size over the limit of {cap} bytes")


def _zip_entries(path: Source, check: _Checker) -> Generator[_Entry, None, None]:
    with _reading(), zipfile.ZipFile(_from_start(path)) as zf:
        for info in zf.infolist():
            member, mode = info.filename, info.external_attr >> 16
            kind = _ZIP_KINDS.get(stat.S_IFMT(mode))
            kind = "dir" if kind == "file" and info.is_dir() else kind
            size, packed = info.file_size, max(info.compress_size, 1)
            if kind is None:
                raise _refuse(member, "is a device, FIFO or other special file")
            if size > _RATIO_FLOOR and size / packed > check.limits.max_compression_ratio:
                raise _refuse(member, f"is compressed {size // packed}x; it looks like a zip bomb")
            # Stored data is exactly as long as declared and deflate expands by well under a
            # quarter: more compressed bytes than that means the declared size was forged.
            if (info.compress_type == zipfile.ZIP_STORED and packed > max(size, 1)) or (
                info.compress_type == zipfile.ZIP_DEFLATED and packed > size + size // 4 + 1024
            ):
                raise _refuse(member, "declares a false size; the archive is corrupt")
            link = ""
            if kind == "symlink":  # a zip symlink's target is the member's content
                with zf.open(info) as f:
                    link = f.read(_MAX_LINK_TARGET).decode("utf-8", "surrogateescape")
            name, link = check.add(member, kind, size if kind == "file" else 0, link)
            opener = functools.partial(zf.open, info) if kind == "file" else None
            yield _Entry(member, name, kind, stat.S_IMODE(mode), link, opener)


def _tar_entries(path: Source, check: _Checker) -> Generator[_Entry, None, None]:
    # Stream mode reads headers in order and never seeks back, so a run that stops at a
    # limit has decompressed only the data before the offending header.
    with _reading(), gzip.open(_from_start(path), "rb") as gz:
        with tarfile.open(fileobj=gz, mode="r|") as tf:
            while (info := tf.next()) is not None:
                kind = "file" if info.isreg() else _TAR_KINDS.get(info.type)
                if kind is None:
                    raise _refuse(info.name, "is a device, FIFO or other special file")
                size = info.size if kind == "file" else 0
                name, link = check.add(info.name, kind, size, info.linkname)
                opener = functools.partial(tf.extractfile, info) if kind == "file" else None
                yield _Entry(info.name, name, kind, stat.S_IMODE(info.mode), link, opener)
        # tarfile stops at the end-of-archive block; read on so that gzip's length and CRC
        # check notices a truncated or corrupt stream.
        tail = 0
        for chunk in _chunks(gz.read):
            tail += len(chunk)
            if tail > _MAX_TAR_TRAILER:
                raise UnsafeArchiveError(f"{_UNREADABLE}: unexpected data after its end")


_Reader = Callable[[Source, _Checker], Generator[_Entry, None, None]]
_READERS: dict[Format, _Reader] = {"zip": _zip_entries, "tar.gz": _tar_entries}


def _from_start(source: Source) -> Source:
    """A path as it is, an open file rewound to its start."""
    if not isinstance(source, Path):
        source.seek(0)
    return source


def detect_format(source: Source) -> Format:
    """Tell the archive format from its magic bytes, whatever the file is called."""
    if isinstance(source, Path):
        with open(source, "rb") as f:
            head = f.read(4)
    else:
        source.seek(0)
        head = source.read(4)
    if head in (b"PK\x03\x04", b"PK\x05\x06"):  # a local file header, or an empty zip
        return "zip"
    if head[:2] == b"\x1f\x8b":
        return "tar.gz"
    raise UnsafeArchiveError(_NOT_ARCHIVE)


def inspect_archive(source: Source, limits: ArchiveLimits = ArchiveLimits()) -> ArchiveSummary:
    """Check every rule without writing anything; raise UnsafeArchiveError if one fails.
    `source`: the archive's path, or an open file (an upload as the request holds it)."""
    fmt = detect_format(source)
    check = _Checker(limits)
    with contextlib.closing(_READERS[fmt](source, check)) as entries:
        for _ in entries:
            pass
    return ArchiveSummary(fmt, check.entries, check.unpacked)


def extract_archive(
    path: Path, dest: Path, limits: ArchiveLimits = ArchiveLimits()
) -> ArchiveSummary:
    """Check and unpack the archive into dest (absent or empty); on error leave dest empty.

    dest is opened once and everything is created beneath its descriptor
    (service.tenantfs): no link on disk is followed, the archive's own or one planted."""
    fmt = detect_format(path)
    existed = True
    with contextlib.suppress(FileExistsError):
        dest.mkdir(parents=True)
        existed = False
    try:
        directory = TenantDir.open(dest)
    except OSError as e:
        raise FileExistsError(f"extraction target {dest} is not an empty directory") from e
    with directory:
        if directory.names():
            raise FileExistsError(f"extraction target {dest} is not an empty directory")
        check = _Checker(limits)
        written = 0
        try:
            with contextlib.closing(_READERS[fmt](path, check)) as entries:
                for entry in entries:
                    written += _write(directory, entry, limits.max_unpacked_bytes - written, check)
        except BaseException:
            directory.clear()
            if not existed:
                os.rmdir(dest)
            raise
    return ArchiveSummary(fmt, check.entries, check.unpacked)


def restored_mode(archived: int) -> int:
    """The mode a regular file is written with, from the mode its archive gives it: its
    owner's execute bit decides between 0o755 and 0o644; set-uid, set-gid, sticky and
    group or other write are never kept."""
    return 0o755 if archived & stat.S_IXUSR else 0o644


def _write(directory: TenantDir, entry: _Entry, room: int, check: _Checker) -> int:
    """Create one validated entry beneath the directory; return the bytes written."""
    if not entry.name:
        return 0
    try:
        if entry.kind == "dir":
            os.close(directory.makedirs(entry.name))
            return 0
        if entry.kind == "symlink":
            directory.symlink(entry.name, entry.link)
        elif entry.kind == "hardlink":
            directory.hardlink(entry.link, entry.name)
        if entry.open is None:
            return 0
        # O_EXCL never follows or reuses an existing path, so a planted link cannot redirect us.
        mode = restored_mode(entry.mode)
        out = directory.create(entry.name, mode)
        os.fchmod(out.fileno(), mode)  # exactly: the umask takes nothing away
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            # Nothing may be created beneath a symlink, not even one this archive made.
            raise _refuse(entry.member, "is written through a symbolic link") from e
        raise
    written = 0
    with out:
        with _reading():
            src = entry.open()
        assert src is not None  # regular members always have a stream
        with src:
            for chunk in _chunks(src.read):
                written += len(chunk)
                if written > room:  # declared sizes can lie; count what actually comes out
                    raise check.too_big(entry.member)
                out.write(chunk)
    return written
