"""Every numbered example (`manifests/NN-*.yaml` with the example directory its header names)
on the embedded platform, as a new user runs them after `dlaas up`: each completes, its
`evaluation_metrics` give a loss (the dashboard's chart), its model deploys READY and
answers a prediction, and nothing in its log says ERROR (the MPI examples' ranks once
logged UCX's failed probe of /sys/class/net)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlaas import Client
from dlaas.errors import ApiError
from dlaas.models import Signature
from tests.e2e.test_up import Up, start_up
from tests.integration.platform_harness import RUNTIMES_DIR, ensure_runtime
from tests.integration.test_numbered_manifests import MANIFESTS, example_of

pytestmark = pytest.mark.e2e

# Every numbered example trains a model and exports it: a SavedModel (TensorFlow), or an
# ONNX model (PyTorch).
DEPLOYS = {manifest.name for manifest in MANIFESTS}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    # The MPI and PyTorch examples' runtimes, from the shared directory (built there on
    # first use).
    ensure_runtime("horovod-tf2.14")
    ensure_runtime("ddl-tf2.14")
    ensure_runtime("pytorch2.13")
    running = start_up(
        tmp_path_factory.mktemp("numbered") / "home", DLAAS_RUNTIMES_DIR=str(RUNTIMES_DIR)
    )
    try:
        yield running
    finally:
        running.stop()
        running.kill()


def instance(signature: Signature) -> Any:
    """One instance for the signature: zeros of each input's shape (its batch dimension
    left out, a dimension of any size taken as 1)."""

    def zeros(shape: tuple[int | None, ...] | None) -> Any:
        dims = [d or 1 for d in (shape or (None, 1))[1:]]
        value: Any = 0.0
        for d in reversed(dims):
            value = [value] * d
        return value

    if len(signature.inputs) == 1:
        return zeros(signature.inputs[0].shape)
    return {t.name: zeros(t.shape) for t in signature.inputs}


def test_every_numbered_example_completes_draws_its_loss_and_deploys(up: Up) -> None:
    assert "DLAAS_RUNTIME_AUTO_INSTALL" not in up.env
    assert "installed on their first use" in up.output  # what `dlaas up` does by default
    with up.client() as client:
        submitted = {
            manifest.name: client.trainings.create(manifest, example_of(manifest)).id
            for manifest in MANIFESTS
        }
        failures: dict[str, str] = {}
        for name, training_id in submitted.items():
            done = client.trainings.wait(training_id, timeout=1200, poll_interval=1)
            if done.status != "COMPLETED":
                failures[name] = f"{done.status} {done.status_message}"
                continue
            check_example(client, name, training_id, failures)
        assert failures == {}, "\n".join(
            f"{name}: {why}\n{tail(client, submitted[name])}" for name, why in failures.items()
        )


def check_example(client: Client, name: str, training_id: str, failures: dict[str, str]) -> None:
    metrics = client.trainings.metrics(training_id)
    if not metrics.get("loss"):
        failures[name] = f"no loss points (metrics: {sorted(metrics)})"
        return
    errors = [line for line in log_lines(client, training_id) if "ERROR" in line]
    if errors:
        failures[name] = f"ERROR in its log: {errors[:3]}"
        return
    if name not in DEPLOYS:
        return
    try:
        created = client.deployments.create(training_id)
    except ApiError as e:  # no SavedModel in its results, say
        failures[name] = f"not deployable: {e}"
        return
    deployment = client.deployments.wait(created.id, 300)
    try:
        if deployment.status != "READY" or deployment.signature is None:
            failures[name] = f"deployment {deployment.status}: {deployment.status_message}"
            return
        answer = client.deployments.predict(deployment.id, [instance(deployment.signature)])
        if not answer:
            failures[name] = f"no prediction: {answer!r}"
    finally:
        client.deployments.delete(deployment.id)


def log_lines(client: Client, training_id: str) -> list[str]:
    with client.trainings.logs(training_id) as lines:
        return list(lines)


def tail(client: Client, training_id: str) -> str:
    return "\n".join(log_lines(client, training_id))[-2000:]


def test_the_examples_are_every_numbered_manifest() -> None:
    assert [m.name[:2] for m in MANIFESTS] == ["01", "02", "03", "04", "05", "06", "07", "08"]
    assert all(isinstance(example_of(m), Path) for m in MANIFESTS)
