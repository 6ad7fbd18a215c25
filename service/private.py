"""Owner-only directories and files: DLAAS_HOME holds the admin key, the secret key, the
SQLite database (key hashes, sealed credentials), logs and uploads, so nothing the platform
creates there is readable by other users of the machine.

Directories are created 0700 and secret-holding files 0600 at creation (never created
open and narrowed afterwards); an existing DLAAS_HOME or file that the user owns is
narrowed on start-up. One owned by someone else is left as it is (chmod would fail).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """`mkdir -p path`, each directory it creates 0700; returns `path`. Directories that
    exist are left as they are (see `private_home` for DLAAS_HOME itself)."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.mkdir(directory, DIR_MODE)
    return path


def private_home(home: Path) -> Path:
    """DLAAS_HOME: created 0700, or narrowed to 0700 if it exists, is the user's and is
    open to others. Returns `home`."""
    private_dir(home)
    narrow(home, DIR_MODE)
    return home


def narrow(path: Path, mode: int) -> None:
    """chmod `path` to `mode` if it is the user's and allows more; a path owned by
    someone else is logged and left alone."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    if stat.S_IMODE(st.st_mode) & ~mode == 0:
        return
    if st.st_uid != os.geteuid():
        log.warning(
            "%s is not yours (uid %d): left at mode %o", path, st.st_uid, stat.S_IMODE(st.st_mode)
        )
        return
    os.chmod(path, stat.S_IMODE(st.st_mode) & mode)


def private_file(path: Path) -> Path:
    """Create `path` empty with mode 0600 if it does not exist (for a file another library
    opens later, such as the SQLite database), else narrow it to 0600. Returns `path`."""
    private_dir(path.parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        narrow(path, FILE_MODE)
    return path


def open_private(path: Path, flags: int) -> int:
    """os.open with O_CREAT and mode 0600 for a file created by this call."""
    return os.open(path, flags | os.O_CREAT, FILE_MODE)
