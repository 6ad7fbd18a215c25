"""model_definition archives: what is accepted, what is refused, and that refusals write nothing."""

from __future__ import annotations

import gzip
import io
import os
import re
import stat
import struct
import subprocess
import tarfile
import warnings
import zipfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Literal

import pytest

from service.storage.archives import (
    ArchiveLimits,
    ArchiveSummary,
    UnsafeArchiveError,
    detect_format,
    extract_archive,
    inspect_archive,
)

# An archive member: (kind, name, payload, mode). kind is "f" file, "d" dir, "l" symlink,
# "h" hard link, or a tarfile type byte for special members; payload is data or link target.
Member = tuple[str | bytes, str, bytes | str, int]
Build = Callable[[], bytes]


def F(name: str, data: bytes = b"x", mode: int = 0o644) -> Member:
    return ("f", name, data, mode)


def D(name: str) -> Member:
    return ("d", name, b"", 0o755)


def L(name: str, target: str) -> Member:
    return ("l", name, target, 0o777)


def H(name: str, target: str) -> Member:
    return ("h", name, target, 0o644)


def S(name: str, kind: bytes) -> Member:
    return (kind, name, b"", 0o644)


def zip_bytes(members: list[Member]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        warnings.simplefilter("ignore")  # duplicate names are a test case, not a mistake
        for kind, name, payload, mode in members:
            info = zipfile.ZipInfo(name + "/" if kind == "d" else name)
            info.compress_type = zipfile.ZIP_DEFLATED
            ftype = {"d": stat.S_IFDIR, "l": stat.S_IFLNK}.get(str(kind), stat.S_IFREG)
            info.external_attr = (ftype | mode) << 16
            zf.writestr(info, payload)
    return buf.getvalue()


def tar_bytes(members: list[Member]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
        for kind, name, payload, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if "\0" in name:  # only a pax header can carry a NUL through to the reader
                info.pax_headers = {"path": name}
            types = {"f": tarfile.REGTYPE, "d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE}
            info.type = kind if isinstance(kind, bytes) else types.get(kind, tarfile.LNKTYPE)
            if kind == "f":
                assert isinstance(payload, bytes)
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
            else:
                info.linkname = payload if isinstance(payload, str) else ""
                tf.addfile(info)
    return buf.getvalue()


def lying_zip(data: bytes = bytes(10_000_000), declared: int = 100) -> bytes:
    """A zip whose central directory understates the size of its one member, big.bin."""
    archive = bytearray(zip_bytes([F("big.bin", data)]))
    central = archive.index(b"PK\x01\x02")
    struct.pack_into("<I", archive, central + 24, declared)  # the uncompressed size field
    return bytes(archive)


def truncated(build: Build, keep: float | int) -> bytes:
    data = build()
    return data[: int(len(data) * keep)] if isinstance(keep, float) else data[:keep]


NOISE = os.urandom(200_000)  # incompressible, so a cut lands inside member data
GOOD_FILES = {
    "pkg/__init__.py": b"",
    "pkg/sub/model.py": b"print('model')\n",
    "train.sh": b"#!/bin/sh\npython -m pkg.sub.model\n",
}
GOOD: list[Member] = [
    D("pkg"),
    F("pkg/__init__.py", GOOD_FILES["pkg/__init__.py"]),
    D("pkg/sub"),
    F("pkg/sub/model.py", GOOD_FILES["pkg/sub/model.py"]),
    F("train.sh", GOOD_FILES["train.sh"], 0o755),
    L("pkg/latest.py", "sub/model.py"),
    L("here", "."),
]
many = [F(f"f{i}.py") for i in range(5)]
ten_mb_zeros = [F("bomb.bin", bytes(10_000_000))]
few = ArchiveLimits(max_files=3)
small = ArchiveLimits(max_unpacked_bytes=1000)
small_any_ratio = ArchiveLimits(max_unpacked_bytes=1000, max_compression_ratio=float("inf"))


def case(build: Build, expected: str, limits: ArchiveLimits = ArchiveLimits(), **kw: Any) -> Any:
    return pytest.param(build, limits, expected, **kw)


def Z(*members: Member) -> Build:
    return partial(zip_bytes, list(members))


def T(*members: Member) -> Build:
    return partial(tar_bytes, list(members))


UNREADABLE = "model_definition is not a readable .zip or .tar.gz archive"
NOT_ARCHIVE = "model_definition must be a .zip or .tar.gz archive"

BAD = [
    case(Z(F("../evil.py")), "entry '../evil.py' escapes the archive root", id="zip-dotdot"),
    case(T(F("../evil.py")), "entry '../evil.py' escapes the archive root", id="tar-dotdot"),
    case(T(F("a/../../evil.py")), "entry 'a/../../evil.py' escapes", id="tar-inner-dotdot"),
    case(Z(F("..\\evil.py")), r"entry '..\\evil.py' escapes", id="zip-backslash-dotdot"),
    case(Z(F("/etc/evil.py")), "entry '/etc/evil.py' has an absolute path", id="zip-absolute"),
    case(T(F("/etc/evil.py")), "entry '/etc/evil.py' has an absolute path", id="tar-absolute"),
    case(Z(F("C:\\evil.py")), r"entry 'C:\\evil.py' has an absolute path", id="zip-drive"),
    case(Z(F("\\evil.py")), r"entry '\\evil.py' has an absolute path", id="zip-backslash-root"),
    case(T(F("ok\0evil.py")), "entry 'ok\\x00evil.py' has a NUL byte", id="tar-nul"),
    case(Z(L("link", "../../etc/passwd")), "'link' links to '../../etc/passwd'", id="zip-sym-up"),
    case(Z(L("link", "/etc/passwd")), "'link' links to '/etc/passwd'", id="zip-sym-absolute"),
    case(T(L("link", "../../etc/passwd")), "'link' links to '../../etc/passwd'", id="tar-sym-up"),
    case(T(L("link", "/etc/passwd")), "'link' links to '/etc/passwd'", id="tar-sym-absolute"),
    case(T(L("sub/up", ".."), L("l2", "sub/up/..")), "'l2' links to", id="tar-sym-via-sym"),
    case(T(H("h", "../../etc/passwd")), "'h' links to '../../etc/passwd'", id="tar-hard-up"),
    case(T(H("h", "/etc/passwd")), "'h' links to '/etc/passwd'", id="tar-hard-absolute"),
    case(T(H("h", "missing.py")), "'h' is a hard link to 'missing.py'", id="tar-hard-missing"),
    case(
        T(D("sub"), L("d", "sub"), F("d/evil.py")),
        "'d/evil.py' is written through the symbolic link 'd'",
        id="tar-write-through-sym",
    ),
    case(
        Z(L("here", "."), F("here/evil.py")),
        "'here/evil.py' is written through the symbolic link 'here'",
        id="zip-write-through-sym",
    ),
    case(T(L("up", ".."), F("up/evil.py")), "'up' links to '..'", id="tar-write-through-up"),
    case(T(F("a"), F("a/b")), "entry 'a/b' is inside 'a', which is a file", id="tar-under-file"),
    case(Z(F("a.py"), F("a.py")), "entry 'a.py' appears more than once", id="zip-duplicate"),
    case(T(S("dev/null", tarfile.CHRTYPE)), "'dev/null' is a device, FIFO", id="tar-chr"),
    case(T(S("dev/sda", tarfile.BLKTYPE)), "'dev/sda' is a device, FIFO", id="tar-blk"),
    case(T(S("pipe", tarfile.FIFOTYPE)), "'pipe' is a device, FIFO", id="tar-fifo"),
    case(
        Z(*many),
        "entry 'f3.py' is over the limit of 3 entries",
        ArchiveLimits(max_files=3),
        id="zip-files",
    ),
    case(
        T(*many),
        "entry 'f3.py' is over the limit of 3 entries",
        ArchiveLimits(max_files=3),
        id="tar-files",
    ),
    case(
        T(F("a.bin", bytes(600)), F("b.bin", bytes(600))),
        "entry 'b.bin' takes the unpacked size over the limit of 1000 bytes",
        small,
        id="tar-size",
    ),
    case(
        partial(truncated, T(F("big.bin", NOISE)), 20_000),
        "entry 'big.bin' takes the unpacked size over the limit of 1000 bytes",
        small,
        id="tar-size-stops-before-data",
    ),
    case(
        Z(*ten_mb_zeros),
        "entry 'bomb.bin' takes the unpacked size",
        small_any_ratio,
        id="zip-bomb-cap",
    ),
    case(Z(*ten_mb_zeros), "entry 'bomb.bin' is compressed", id="zip-bomb-ratio"),
    case(lying_zip, "entry 'big.bin' declares a false size", id="zip-size-lie"),
    case(partial(truncated, Z(F("a.bin", NOISE)), 0.5), UNREADABLE, id="zip-truncated"),
    case(partial(truncated, T(F("a.bin", NOISE)), 0.5), UNREADABLE, id="tar-truncated"),
    case(partial(truncated, T(F("a.bin", NOISE)), -4), UNREADABLE, id="tar-no-gzip-trailer"),
    case(lambda: b"just some text\n", NOT_ARCHIVE, id="plain-text"),
    case(lambda: b"", NOT_ARCHIVE, id="empty-file"),
    case(lambda: gzip.compress(b"not a tar\n" * 100), UNREADABLE, id="gzip-not-tar"),
]


def write(tmp_path: Path, build: Build) -> Path:
    archive = tmp_path / "upload.bin"  # the name says nothing; the format comes from the bytes
    archive.write_bytes(build())
    return archive


@pytest.mark.parametrize(
    ("fmt", "build"), [("zip", zip_bytes), ("tar.gz", tar_bytes)], ids=["zip", "tar.gz"]
)
def test_good_archive_is_inspected_and_extracted(
    tmp_path: Path, fmt: Literal["zip", "tar.gz"], build: Callable[[list[Member]], bytes]
) -> None:
    members = [*GOOD, H("pkg/copy.py", "pkg/sub/model.py")] if fmt == "tar.gz" else GOOD
    archive = write(tmp_path, partial(build, members))
    expected = ArchiveSummary(fmt, len(members), sum(map(len, GOOD_FILES.values())))

    assert inspect_archive(archive) == expected
    dest = tmp_path / "out" / "dest"
    assert extract_archive(archive, dest) == expected

    for name, data in GOOD_FILES.items():
        assert (dest / name).read_bytes() == data
    assert os.access(dest / "train.sh", os.X_OK)
    assert not os.access(dest / "pkg/sub/model.py", os.X_OK)
    assert os.readlink(dest / "pkg/latest.py") == "sub/model.py"
    assert (dest / "pkg/latest.py").read_bytes() == GOOD_FILES["pkg/sub/model.py"]
    assert os.readlink(dest / "here") == "."
    if fmt == "tar.gz":
        assert (dest / "pkg/copy.py").read_bytes() == GOOD_FILES["pkg/sub/model.py"]
        assert not (dest / "pkg/copy.py").is_symlink()


@pytest.mark.parametrize(("build", "limits", "expected"), BAD)
def test_inspect_refuses(
    tmp_path: Path, build: Build, limits: ArchiveLimits, expected: str
) -> None:
    with pytest.raises(UnsafeArchiveError, match=re.escape(expected)):
        inspect_archive(write(tmp_path, build), limits)


@pytest.mark.parametrize(("build", "limits", "expected"), BAD)
def test_inspect_refuses_an_open_upload_alike(
    build: Build, limits: ArchiveLimits, expected: str
) -> None:
    """A submission inspects the upload as the request holds it (an open file, read from
    wherever the request left it), by the same rules as a file on disk."""
    upload = io.BytesIO(build())
    upload.seek(0, io.SEEK_END)
    with pytest.raises(UnsafeArchiveError, match=re.escape(expected)):
        inspect_archive(upload, limits)
    assert not upload.closed


@pytest.mark.parametrize("build", [zip_bytes, tar_bytes], ids=["zip", "tar.gz"])
def test_an_open_upload_is_inspected_as_its_file_is(tmp_path: Path, build: Build) -> None:
    data = partial(build, GOOD)()
    upload = io.BytesIO(data)
    upload.seek(7)
    assert inspect_archive(upload) == inspect_archive(write(tmp_path, lambda: data))
    assert not upload.closed


@pytest.mark.parametrize("dest_exists", [False, True], ids=["new-dest", "empty-dest"])
@pytest.mark.parametrize(("build", "limits", "expected"), BAD)
def test_extract_refuses_and_leaves_nothing(
    tmp_path: Path, build: Build, limits: ArchiveLimits, expected: str, dest_exists: bool
) -> None:
    archive = write(tmp_path, build)
    box = tmp_path / "box"  # where a '../' entry of dest would land
    dest = box / "dest"
    (dest if dest_exists else box).mkdir(parents=True)

    with pytest.raises(UnsafeArchiveError, match=re.escape(expected)):
        extract_archive(archive, dest, limits)

    assert sorted(os.listdir(tmp_path)) == ["box", "upload.bin"]
    assert os.listdir(box) == (["dest"] if dest_exists else [])
    if dest_exists:
        assert os.listdir(dest) == []


def test_extract_counts_real_bytes_not_declared_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stand in for a zip reader that yields more than the central directory declared.
    archive = write(tmp_path, Z(F("small.bin", bytes(100))))
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *a, **k: io.BytesIO(bytes(5000)))
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchiveError, match=r"'small\.bin' takes the unpacked size over"):
        extract_archive(archive, dest, small)
    assert not dest.exists()


def test_extract_refuses_a_zip_whose_size_lies_too_little_to_see(tmp_path: Path) -> None:
    # 10% short of the truth is within what the declared-size check can tell from the
    # compressed size, so inspect passes; extraction still stops at the declared size.
    archive = write(tmp_path, partial(lying_zip, NOISE, len(NOISE) * 9 // 10))
    limits = ArchiveLimits(max_unpacked_bytes=len(NOISE) - 1)
    assert inspect_archive(archive, limits).unpacked_bytes == len(NOISE) * 9 // 10
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchiveError, match=rf"{UNREADABLE}: .*'big\.bin'"):
        extract_archive(archive, dest, limits)
    assert not dest.exists()


@pytest.mark.parametrize(
    ("build", "fmt"), [(Z(F("a")), "zip"), (T(F("a")), "tar.gz")], ids=["zip", "tar.gz"]
)
def test_format_comes_from_magic_bytes_not_the_name(tmp_path: Path, build: Build, fmt: str) -> None:
    wrong_name = tmp_path / ("code.tar.gz" if fmt == "zip" else "code.zip")
    wrong_name.write_bytes(build())
    assert detect_format(wrong_name) == fmt


def test_extract_refuses_a_non_empty_dest(tmp_path: Path) -> None:
    archive = write(tmp_path, Z(F("a.py")))
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        extract_archive(archive, dest)
    assert os.listdir(dest) == ["keep.txt"]


def test_extract_into_an_existing_empty_dest(tmp_path: Path) -> None:
    archive = write(tmp_path, T(D("."), F("./a.py", b"ok")))
    dest = tmp_path / "dest"
    dest.mkdir()
    assert extract_archive(archive, dest) == ArchiveSummary("tar.gz", 2, 2)
    assert (dest / "a.py").read_bytes() == b"ok"


@pytest.mark.parametrize(
    ("archived", "written"),
    [
        (0o755, 0o755),
        (0o644, 0o644),
        (0o700, 0o755),  # the owner's execute bit decides
        (0o744, 0o755),
        (0o600, 0o644),
        (0o011, 0o644),  # group's and other's execute bits alone do not
        (0o4755, 0o755),  # set-uid dropped
        (0o2755, 0o755),  # set-gid dropped
        (0o1777, 0o755),  # sticky and group/other write dropped
        (0o666, 0o644),  # group/other write dropped
        (0o000, 0o644),  # no Unix mode (an archiver on another system)
    ],
)
@pytest.mark.parametrize("build", [zip_bytes, tar_bytes], ids=["zip", "tar.gz"])
def test_file_modes_are_restored_execute_bits_only(
    tmp_path: Path, build: Callable[[list[Member]], bytes], archived: int, written: int
) -> None:
    archive = write(tmp_path, partial(build, [F("launcher.py", b"#!/bin/sh\necho hi\n", archived)]))
    dest = tmp_path / "dest"
    old = os.umask(0o077)  # the mode is written exactly, whatever the umask
    try:
        extract_archive(archive, dest)
    finally:
        os.umask(old)
    assert stat.S_IMODE((dest / "launcher.py").stat().st_mode) == written


@pytest.mark.parametrize("build", [zip_bytes, tar_bytes], ids=["zip", "tar.gz"])
def test_a_launcher_packed_0755_runs_as_dot_slash(
    tmp_path: Path, build: Callable[[list[Member]], bytes]
) -> None:
    script = b'#!/bin/sh\necho launched "$@"\n'
    archive = write(tmp_path, partial(build, [F("launcher.py", script, 0o755)]))
    dest = tmp_path / "dest"
    extract_archive(archive, dest)
    run = subprocess.run(["./launcher.py", "x"], cwd=dest, capture_output=True, text=True)
    assert (run.returncode, run.stdout) == (0, "launched x\n")
