"""service.tenantfs: what the platform reads from (and writes into) a directory a tenant
writes. Every case runs on both resolutions: openat2 (where the kernel has it) and the
component-by-component O_NOFOLLOW walk."""

from __future__ import annotations

import io
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from service import tenantfs
from service.tenantfs import FileRef, TenantDir, tree

SECRET = b"SECRET-MARKER-7f3a"


@pytest.fixture(params=["openat2", "fallback"])
def resolution(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2":
        if not tenantfs._kernel_has_openat2():
            pytest.skip("this kernel has no openat2")
        monkeypatch.setattr(tenantfs, "USE_OPENAT2", True)
    else:
        monkeypatch.setattr(tenantfs, "USE_OPENAT2", False)
    return str(request.param)


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[Path]:
    """root/ holds a tenant's tricks around outside/, which holds a secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    (outside / "hardlinked").write_bytes(SECRET)
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "regular").write_bytes(b"ok")
    (root / "sub" / "f").write_bytes(b"nested")
    (root / "link-file-out").symlink_to(outside / "secret")
    (root / "link-file-rel-out").symlink_to("../outside/secret")
    (root / "link-file-in").symlink_to("regular")
    (root / "link-dir-out").symlink_to(outside)
    (root / "link-dir-in").symlink_to("sub")
    (root / "dangling").symlink_to(tmp_path / "nothing")
    (root / "proc-environ").symlink_to("/proc/self/environ")
    (root / "proc-fd").symlink_to(f"/proc/{os.getpid()}/cwd")
    os.link(outside / "hardlinked", root / "hardlink")
    os.mkfifo(root / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "socket"))
    yield root
    server.close()


@pytest.mark.parametrize(
    ("relative", "expected"),
    [
        ("regular", b"ok"),
        ("sub/f", b"nested"),
        ("link-file-out", None),
        ("link-file-rel-out", None),
        ("link-file-in", None),  # no link is followed, even to a file inside
        ("link-dir-out/secret", None),
        ("link-dir-in/f", None),
        ("dangling", None),
        ("proc-environ", None),
        ("proc-fd/outside/secret", None),
        ("hardlink", None),  # a second link can name a file outside
        ("fifo", None),  # not opened blocking, not read
        ("socket", None),
        ("sub", None),
        ("missing", None),
        ("../outside/secret", None),
        ("sub/../../outside/secret", None),
        ("/etc/passwd", None),
        ("regular\0/../../outside/secret", None),
        ("", None),
    ],
)
def test_only_regular_files_of_their_own_beneath_the_root_are_read(
    resolution: str, layout: Path, relative: str, expected: bytes | None
) -> None:
    with TenantDir.open(layout) as directory:
        opened = directory.open_file(relative)
        if expected is None:
            assert opened is None
        else:
            assert opened is not None
            with opened:
                assert opened.read() == expected


def test_a_tree_lists_regular_files_only_and_reads_nothing_outside(
    resolution: str, layout: Path
) -> None:
    files = tree(layout, "p/")
    # `hardlink` is a regular file when listed; opening it refuses it.
    assert [key for key, _ in files] == ["p/hardlink", "p/regular", "p/sub/f"]
    read = {}
    for key, ref in files:
        opened = ref.open()
        if opened is not None:
            with opened:
                read[key] = opened.read()
    assert read == {"p/regular": b"ok", "p/sub/f": b"nested"}


def test_a_root_that_is_a_link_is_not_entered(resolution: str, layout: Path) -> None:
    link = layout.parent / "root-link"
    link.symlink_to(layout.parent / "outside")
    assert tree(link, "") == []
    assert TenantDir.open_if_dir(link) is None
    assert FileRef(link, "secret").open() is None


def test_a_file_replaced_by_a_link_between_listing_and_opening_is_skipped(
    resolution: str, layout: Path
) -> None:
    files = dict(tree(layout, ""))
    (layout / "regular").unlink()
    (layout / "regular").symlink_to(layout.parent / "outside" / "secret")
    (layout / "sub").rename(layout / "sub-moved")
    (layout / "sub").symlink_to(layout.parent / "outside")
    assert files["regular"].open() is None
    assert files["sub/f"].open() is None


def test_a_growing_file_is_read_to_the_size_fstat_gave(resolution: str, layout: Path) -> None:
    with TenantDir.open(layout) as directory:
        opened = directory.open_file("regular")
    assert opened is not None
    with opened:
        with (layout / "regular").open("ab") as f:
            f.write(SECRET)
        assert opened.size == 2
        assert opened.read() == b"ok"
        assert opened.reader().read() == b"ok"  # a new reader starts again at 0


def test_a_sparse_file_is_read_to_its_size_and_no_further(resolution: str, layout: Path) -> None:
    with (layout / "sparse").open("wb") as f:
        f.truncate(1 << 20)
        f.seek((1 << 20) - 1)
        f.write(b"x")
    opened = FileRef(layout, "sparse").open()
    assert opened is not None
    with opened:
        data = opened.read()
    assert len(data) == 1 << 20 and data.endswith(b"\0x") and data.count(b"\0") == (1 << 20) - 1


def test_a_file_swapped_with_links_all_along_never_yields_outside_bytes(
    resolution: str, layout: Path
) -> None:
    secret = layout.parent / "outside" / "secret"
    target = layout / "swapped"
    done = threading.Event()

    def swap() -> None:
        i = 0
        while not done.is_set():
            tmp = layout / f".tmp{i % 2}"
            # Symbolic links: a hard link made and removed while it is opened can pass
            # for the tenant's own file (see service.tenantfs.TenantDir.open_file).
            if i % 3 == 0:
                tmp.write_bytes(b"benign")
            elif i % 3 == 1:
                tmp.symlink_to(secret)
            else:
                tmp.symlink_to(secret.parent)
            os.replace(tmp, target)
            i += 1

    thread = threading.Thread(target=swap)
    thread.start()
    seen = set()
    swapped_read = 0  # times the swapped name was read, as a regular file
    try:
        for n in range(5000):
            if n >= 400 and swapped_read:
                break
            for key, ref in tree(layout, ""):
                opened = ref.open()
                if opened is not None:
                    with opened:
                        seen.add(opened.read())
                    swapped_read += key == "swapped"
    finally:
        done.set()
        thread.join()
    assert SECRET not in b"".join(seen)
    assert swapped_read


# -- writes ----------------------------------------------------------------------------------


def test_writes_create_directories_and_replace_a_planted_link(
    resolution: str, layout: Path
) -> None:
    secret = layout.parent / "outside" / "secret"
    with TenantDir.open(layout) as directory:
        assert directory.write("new/deep/file", io.BytesIO(b"data")) == 4
        assert directory.write("link-file-out", io.BytesIO(b"over")) == 4
    assert (layout / "new" / "deep" / "file").read_bytes() == b"data"
    assert not (layout / "link-file-out").is_symlink()
    assert (layout / "link-file-out").read_bytes() == b"over"
    assert secret.read_bytes() == SECRET


@pytest.mark.parametrize(
    ("relative", "error"),
    [
        ("link-dir-out/secret", OSError),
        ("link-dir-out/new", OSError),
        ("link-dir-in/new", OSError),
        ("regular/new", OSError),
        ("../outside/secret", ValueError),
        ("/tmp/x", ValueError),
        ("a//b", ValueError),
        ("new\0../../x", ValueError),
    ],
)
def test_a_write_through_a_link_or_outside_is_refused(
    resolution: str, layout: Path, relative: str, error: type[Exception]
) -> None:
    before = sorted(p.name for p in (layout.parent / "outside").iterdir())
    with TenantDir.open(layout) as directory, pytest.raises(error):
        directory.write(relative, io.BytesIO(b"attack"))
    assert sorted(p.name for p in (layout.parent / "outside").iterdir()) == before
    assert (layout.parent / "outside" / "secret").read_bytes() == SECRET
    assert not any(p.name.startswith(".dlaas-write-") for p in layout.rglob("*"))
