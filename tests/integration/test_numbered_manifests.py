"""Every numbered manifest of manifests/ runs unchanged with the example directory its
header names (`# Example code: examples/NAME`), through the platform, to COMPLETED."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.runtimes import RuntimeInfo
from tests.integration.platform_harness import ROOT, LivePlatform, live_platform, zip_dir

pytestmark = pytest.mark.integration

MANIFESTS = sorted((ROOT / "manifests").glob("[0-9][0-9]-*.yaml"))
EXAMPLE = re.compile(r"^# Example code: (examples/[\w.-]+)", re.MULTILINE)


def example_of(manifest: Path) -> Path:
    found = EXAMPLE.search(manifest.read_text())
    assert found, f"{manifest.name} names no example directory in its header"
    directory = ROOT / found[1]
    assert directory.is_dir(), f"{manifest.name} names {found[1]}, which does not exist"
    return directory


def test_every_numbered_manifest_names_its_example() -> None:
    assert len(MANIFESTS) >= 6
    for manifest in MANIFESTS:
        example_of(manifest)


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory,
    horovod_runtime: RuntimeInfo,
    ddl_runtime: RuntimeInfo,
    pytorch_runtime: RuntimeInfo,
) -> Iterator[LivePlatform]:
    home = tmp_path_factory.mktemp("numbered")
    with live_platform(home / "home", f"sqlite:///{home / 'dlaas.db'}") as p:
        yield p


def test_every_numbered_manifest_completes_with_its_example(live: LivePlatform) -> None:
    submitted = {}
    for manifest in MANIFESTS:
        r = live.client.post(
            "/v1/trainings",
            files={
                # The file as it is in the repository, not a re-serialisation of it.
                "manifest": (manifest.name, manifest.read_bytes()),
                "model_definition": ("code.zip", zip_dir(example_of(manifest))),
            },
            headers=live.headers,
        )
        assert r.status_code == 201, (manifest.name, r.text)
        submitted[manifest.name] = r.json()["id"]
    outcomes = {}
    for name, training_id in submitted.items():
        done = live.wait_for(training_id, {"COMPLETED", "FAILED", "HALTED"}, timeout=900)
        outcomes[name] = done["status"]
        if done["status"] != "COMPLETED":
            print(name, done, live.logs(training_id)[-3000:])
    assert outcomes == {name: "COMPLETED" for name in submitted}
