"""A runtime installed on its first use (DLAAS_RUNTIME_AUTO_INSTALL) builds in the
background: while it builds, the worker goes on launching other trainings. Here the
install is a real one, through the worker subprocess, of a stand-in Horovod runtime whose
local package's build blocks until the test releases it; meanwhile another tenant's
training, on the platform's own runtime, starts and completes. Released, the install ends
and the training that waited for it is launched."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import zip_of
from tests.integration.platform_harness import ADMIN, LivePlatform, live_platform
from tests.integration.test_training_lifecycle import cluster_settings, manifest

pytestmark = pytest.mark.integration

RUNTIME = "horovod-tf2.14"
# A PEP 517 build backend (in the package's tree) that builds a one-file wheel only once
# the test creates the release file: the build announces itself with the started file.
BACKEND = """
import base64, hashlib, os, time, zipfile

STARTED, RELEASE = {started!r}, {release!r}
NAME = "dlaas_slow_build-0.1"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    open(STARTED, "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(RELEASE):
        if time.monotonic() > deadline:
            raise SystemExit("never released")
        time.sleep(0.1)
    wheel = NAME + "-py3-none-any.whl"
    files = {{
        "dlaas_slow_build.py": "",
        NAME + ".dist-info/METADATA": (
            "Metadata-Version: 2.1\\nName: dlaas-slow-build\\nVersion: 0.1\\n"
        ),
        NAME + ".dist-info/WHEEL": (
            "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\n"
            "Tag: py3-none-any\\n"
        ),
    }}
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
            record.append(f"{{path}},sha256={{digest.decode()}},{{len(text.encode())}}")
        record.append(NAME + ".dist-info/RECORD,,")
        z.writestr(NAME + ".dist-info/RECORD", "\\n".join(record) + "\\n")
    return wheel
"""


@pytest.fixture
def slow_definitions(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Runtime definitions whose Horovod stand-in builds a local package that blocks; the
    files the build writes when it starts and waits for before it ends."""
    directory = tmp_path / "definitions"
    package = directory / "packages" / "slow"
    package.mkdir(parents=True)
    started, release = tmp_path / "build-started", tmp_path / "build-release"
    (package / "backend.py").write_text(BACKEND.format(started=str(started), release=str(release)))
    (package / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = []
            build-backend = "backend"
            backend-path = ["."]

            [project]
            name = "dlaas-slow-build"
            version = "0.1"
            """
        )
    )
    (directory / f"{RUNTIME}.txt").write_text(
        "# a stand-in that builds slowly\n#! local packages/slow\n"
    )
    return directory, started, release


@pytest.fixture
def live(
    tmp_path: Path, database_url: str, slow_definitions: tuple[Path, Path, Path]
) -> Iterator[LivePlatform]:
    settings = {
        "DLAAS_RUNTIME_AUTO_INSTALL": "true",
        "DLAAS_RUNTIME_DEFINITIONS_DIR": str(slow_definitions[0]),
        # Its own runtimes directory: the stand-in is not the shared Horovod runtime.
        "DLAAS_RUNTIMES_DIR": str(tmp_path / "runtimes"),
        **cluster_settings(database_url),
    }
    with live_platform(tmp_path / "home", database_url, **settings) as p:
        yield p


def _tenant(live: LivePlatform, name: str) -> dict[str, str]:
    r = live.client.post(
        "/v1/tenants",
        json={"name": name, "plan": "standard"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


def _wait(what: str, check: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_slow_install_does_not_hold_back_another_tenants_training(
    live: LivePlatform, slow_definitions: tuple[Path, Path, Path]
) -> None:
    _definitions, started, release = slow_definitions
    waiting = live.submit(
        {
            "name": "waits-for-its-runtime",
            "framework": {
                "name": "tensorflow-horovod",
                "version": "2.21",
                "command": "python3 -c 'print(1)'",
            },
            "compute_configuration": {"name": "P100", "nodes": 2},
        },
        zip_of({"train.py": "print('hello')\n"}),
    )
    _wait("the install to start", started.exists)
    installing = f"installing the runtime '{RUNTIME}' on its first use"
    _wait(
        "the install's progress",
        lambda: live.get(waiting["id"])["status_message"].startswith(installing),
    )
    # Another tenant's training, on the platform's runtime, runs to its end meanwhile.
    own = live.headers
    live.headers = _tenant(live, "other")
    try:
        other = live.submit(
            manifest("python3 train.py"), zip_of({"train.py": "print('done meanwhile')\n"})
        )
        done = live.wait_for(other["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=120)
        assert done["status"] == "COMPLETED", done
        assert "done meanwhile" in live.logs(other["id"])
    finally:
        live.headers = own
    assert not release.exists()
    still = live.get(waiting["id"])
    assert still["status"] == "PENDING" and still["status_message"].startswith(installing)
    # Released, the install ends and the training that waited is launched in the runtime.
    release.touch()
    _wait(
        "the waiting training to be launched",
        lambda: (
            live.get(waiting["id"])["status"] != "PENDING"
            or "installed in" in live.get(waiting["id"])["status_message"]
        ),
    )
    _wait(
        "the waiting training to leave PENDING",
        lambda: live.get(waiting["id"])["status"] != "PENDING",
    )
    assert RUNTIME in live.platform.installed_runtimes()
    r = live.client.post(f"/v1/trainings/{waiting['id']}/stop", headers=live.headers)
    assert r.status_code in (200, 409), r.text
    live.wait_for(waiting["id"], {"COMPLETED", "FAILED", "HALTED"}, timeout=120)
