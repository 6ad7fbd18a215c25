"""Train for real through the platform, deploy, predict: the predictions are the model's own.

Two trainings run side by side: examples/keras-single (one learner, Keras) and
examples/savedmodel-export as a two-learner tensorflow-horovod job (mpirun across the
learners; the README's procedure for a model whose training graph cannot be saved). The
last test serves predictions from a separate scoring process (`python -m service.scoring`)
behind an API that forwards them (DLAAS_SCORING_URL).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.platform import Platform
from service.runtimes import RuntimeInfo
from service.settings import Settings
from tests.integration.platform_harness import EXAMPLES, LivePlatform, live_platform

pytestmark = pytest.mark.integration

tf = pytest.importorskip("tensorflow", reason="install the tensorflow extra")

X = np.random.default_rng(7).uniform(-1, 1, size=(16, 2)).astype(np.float32)


def manifest(name: str, framework: str, command: str, nodes: int) -> dict[str, Any]:
    return {
        "name": name,
        "framework": {"name": framework, "version": "2.21", "command": command},
        "compute_configuration": {"name": "P100", "nodes": nodes},
    }


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePlatform]:
    home = tmp_path_factory.mktemp("deploy")
    with live_platform(home / "home", f"sqlite:///{home / 'dlaas.db'}") as p:
        yield p


@pytest.fixture(scope="module")
def trainings(live: LivePlatform, horovod_runtime: RuntimeInfo) -> dict[str, str]:
    """Both trainings submitted at once; each test waits for its own."""
    keras = live.submit(
        manifest("keras", "tensorflow", "python3 train.py --epochs 3", 1),
        EXAMPLES / "keras-single",
    )
    horovod = live.submit(
        manifest("exported", "tensorflow-horovod", "python3 export.py --steps 200", 2),
        EXAMPLES / "savedmodel-export",
    )
    return {"keras": keras["id"], "horovod": horovod["id"]}


def own_predictions(live: LivePlatform, training_id: str, tmp_path: Path) -> np.ndarray:
    """What the trained SavedModel itself answers for X, loaded with TensorFlow here."""
    for key, data in live.results(training_id).items():
        if key.startswith("model/"):
            (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / key).write_bytes(data)
    function = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
    outputs: dict[str, Any] = function(x=tf.constant(X))
    result: np.ndarray = outputs["y"].numpy()
    return result


def deploy(client: TestClient, headers: dict[str, str], training_id: str) -> dict[str, Any]:
    r = client.post("/v1/deployments", json={"training_id": training_id}, headers=headers)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 90
    while True:
        body: dict[str, Any] = client.get(
            f"/v1/deployments/{r.json()['id']}", headers=headers
        ).json()
        if body["status"] != "DEPLOYING":
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def assert_serves(
    client: TestClient, headers: dict[str, str], deployment_id: str, own: np.ndarray
) -> None:
    url = f"/v1/deployments/{deployment_id}/predictions"
    rows = client.post(url, json={"instances": X.tolist()}, headers=headers)
    assert rows.status_code == 200, rows.text
    np.testing.assert_allclose(rows.json()["predictions"], own, rtol=0, atol=1e-4)
    columns = client.post(url, json={"inputs": {"x": X.tolist()}}, headers=headers)
    assert columns.status_code == 200, columns.text
    np.testing.assert_allclose(columns.json()["outputs"], own, rtol=0, atol=1e-4)


def completed(live: LivePlatform, training_id: str) -> None:
    done = live.wait_for(training_id, {"COMPLETED", "FAILED", "HALTED"})
    assert done["status"] == "COMPLETED", (done, live.logs(training_id)[-3000:])


def test_keras_training_deployed_answers_like_the_model(
    live: LivePlatform, trainings: dict[str, str], tmp_path: Path
) -> None:
    completed(live, trainings["keras"])
    deployment = deploy(live.client, live.headers, trainings["keras"])
    assert deployment["status"] == "READY", deployment
    assert deployment["signature"]["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": [None, 2]}
    ]
    assert_serves(
        live.client,
        live.headers,
        deployment["id"],
        own_predictions(live, trainings["keras"], tmp_path),
    )


def test_horovod_training_exported_by_the_readme_procedure_is_servable(
    live: LivePlatform, trainings: dict[str, str], tmp_path: Path
) -> None:
    completed(live, trainings["horovod"])
    assert "rank=1 size=2" in live.logs(trainings["horovod"])
    deployment = deploy(live.client, live.headers, trainings["horovod"])
    assert deployment["status"] == "READY", deployment
    own = own_predictions(live, trainings["horovod"], tmp_path)
    np.testing.assert_allclose(own, X @ np.array([[3.0], [-2.0]]) + 0.5, atol=0.1)  # it learned
    assert_serves(live.client, live.headers, deployment["id"], own)


@pytest.fixture
def scoring_process(live: LivePlatform) -> Iterator[str]:
    """`python -m service.scoring` on the live platform's settings."""
    with httpx.Client() as probe:
        port = _free_port()
        env = {**live.env, "DLAAS_SCORING_POLL_INTERVAL": "0.2"}
        log = (live.settings.home_dir / "scoring.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.scoring", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, (live.settings.home_dir / "scoring.log").read_text()
                try:
                    if probe.get(f"{url}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.1)
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
            log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_a_separate_scoring_process_serves_through_the_api(
    live: LivePlatform, trainings: dict[str, str], scoring_process: str, tmp_path: Path
) -> None:
    completed(live, trainings["keras"])
    settings = Settings(**{**live.settings.model_dump(), "scoring_url": scoring_process})
    platform = Platform.from_settings(settings)
    try:
        with TestClient(create_app(platform=platform)) as api:
            assert not hasattr(api.app.state, "scoring")  # this API scores nothing itself
            deployment = deploy(api, live.headers, trainings["keras"])
            assert deployment["status"] == "READY", deployment
            own = own_predictions(live, trainings["keras"], tmp_path)
            assert_serves(api, live.headers, deployment["id"], own)
            bad = api.post(
                f"/v1/deployments/{deployment['id']}/predictions",
                json={"instances": [[1.0]]},
                headers=live.headers,
            )
            assert bad.status_code == 400
            assert bad.headers["content-type"] == "application/problem+json"
            assert bad.json()["errors"][0]["field"] == "/instances"
            r = api.delete(f"/v1/deployments/{deployment['id']}", headers=live.headers)
            assert r.status_code == 204
            deadline = time.monotonic() + 10  # the scoring process notices within seconds
            while True:
                r = api.post(
                    f"/v1/deployments/{deployment['id']}/predictions",
                    json={"instances": X.tolist()},
                    headers=live.headers,
                )
                if r.status_code == 404 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert r.status_code == 404
    finally:
        platform.close()
