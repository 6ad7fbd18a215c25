"""The Kubernetes backend against the emulated API server (tests/k8s_emulator.py: no
cluster runs here).

- k8s_submit_to_pods_p50: a `dlaas up` with DLAAS_BACKEND=kubernetes and KUBECONFIG naming
  the emulator; from the submission through the REST API until every pod of the training
  exists in the cluster (the monitor admits it, a worker launches it). Baseline: creating
  the same objects straight through the client (what the platform adds is the ratio).
  Target: <= 0.3 s.
- k8s_monitor_pass_requests: what a monitor pass costs the cluster at 1,000 active
  trainings against 10 (baseline): the API requests per pass (observing every training
  and asking what the backend holds). Watch-driven, a pass reads the watch's cache, so
  the count does not grow with the trainings (target: ratio <= 3); polling every pod would
  make one request per training per pass. The detail has each pass's wall time.
- k8s_monitor_pass_ms: the wall time of the monitor's own pass (`Monitor.tick`: the
  database read, observing, recording) at 1,000 active trainings against 10 (baseline),
  one pod changing between passes. Watch-driven, a pass between two full ones reconciles
  what changed, not what runs (target: ratio <= 3). The full pass, every
  DLAAS_MONITOR_FULL_PASS_SECONDS, reconciles every training; its time and the cost per
  pass averaged over one full pass and the passes until the next are in the detail.
- k8s_admission_pass_ms, k8s_gpu_utilisation: gang admission from the cluster's capacity
  (benchmarks/k8s_capacity.py, run from here).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client, config

from benchmarks.common import Row, dlaas_up, manifest, median, percentile, zip_code
from service.db.models import Learner, Training, utcnow
from service.db.session import upgrade
from service.domain.states import TrainingState
from service.logs.config import LogSinkConfig
from service.platform import Platform
from service.settings import Settings
from service.storage.config import StoreConfig
from service.tenants import create_tenant
from tests.k8s_emulator import RunningApiserver, running_apiserver
from tests.s3_server import ACCESS_KEY, SECRET_KEY, moto_server
from worker.backends.base import StartRequest
from worker.backends.kubernetes.backend import KubernetesBackend
from worker.backends.kubernetes.objects import ClusterConfig
from worker.launchers.plan import TrainingSpec, learner_name_prefix
from worker.monitor import Monitor

NAMESPACE = "dlaas"
# The shared Redis (never flushed here): the live logs of the trainings submitted.
LOG_STORE = "redis://127.0.0.1:6379/3"
CLUSTER = ClusterConfig(
    NAMESPACE, "bench.example.com/dlaas/", "1.0", (), "nvidia.com/gpu", "cluster.local"
)


@dataclass
class Cluster:
    apiserver: RunningApiserver
    core: client.CoreV1Api  # the benchmark's own client (the kubelet, the checks)

    def api(self) -> client.ApiClient:
        """A client of its own, as the platform's backend has."""
        return config.new_client_from_config(config_file=str(self.apiserver.kubeconfig))

    def forget_requests(self) -> None:
        """Clear the emulator's request log. kmock keeps every request (for tests'
        assertions) and routes each new one by scanning them, which makes the emulator's
        own cost grow with the requests made; no real API server does that. Called between
        batches, while none is in flight."""

        async def clear() -> None:
            self.apiserver.emulator._requests.clear()

        self.apiserver.call(clear())


@contextmanager
def emulated_cluster() -> Iterator[Cluster]:
    with (
        tempfile.TemporaryDirectory(prefix="dlaas-k8s-") as tmp,
        running_apiserver(Path(tmp), history_limit=100_000) as apiserver,
    ):
        api = config.new_client_from_config(config_file=str(apiserver.kubeconfig))
        try:
            yield Cluster(apiserver, client.CoreV1Api(api))
        finally:
            api.close()


def _pods_of(core: client.CoreV1Api, training_id: str) -> int:
    selector = f"dlaas.io/training-id={training_id}"
    return len(core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)


def submit_to_pods(quick: bool) -> Row:
    repeats = 5 if quick else 20
    nodes = 2
    times: list[float] = []
    direct: list[float] = []
    with emulated_cluster() as cluster, moto_server() as s3:
        core = cluster.core
        with (
            dlaas_up(
                DLAAS_BACKEND="kubernetes",
                DLAAS_K8S_NAMESPACE=NAMESPACE,
                KUBECONFIG=str(cluster.apiserver.kubeconfig),
                # Stores the pods reach (dlaas up refuses this machine's directories).
                DLAAS_S3_ENDPOINT=s3.url,
                DLAAS_S3_ACCESS_KEY=ACCESS_KEY,
                DLAAS_S3_SECRET_KEY=SECRET_KEY,
                DLAAS_S3_BUCKET="dlaas-bench",
                DLAAS_LOG_STORE_URL=LOG_STORE,
                # Where the pods reach those stores, through each training's NetworkPolicy
                # (dlaas up refuses a cluster backend that does not say).
                DLAAS_K8S_EGRESS_CIDRS="127.0.0.0/8",
                # The learners' store credentials are assumed from a role (moto's STS).
                DLAAS_STORE_ROLE_ARN="arn:aws:iam::123456789012:role/dlaas-learners",
            ) as platform,
            platform.client() as http,
        ):
            code = zip_code({"train.py": "print('hello')\n"})
            text = manifest("python3 train.py", nodes=nodes, parameter_servers=0)
            for _ in range(repeats):
                started = time.perf_counter()
                training = platform.submit(http, text, code)
                while _pods_of(core, training["id"]) < nodes:
                    time.sleep(0.005)
                times.append(time.perf_counter() - started)
                platform.wait(http, training["id"], {"PENDING"}, timeout=30)
                cluster.forget_requests()
        backend = KubernetesBackend(cluster.api(), CLUSTER)
        try:
            for i in range(repeats):
                started = time.perf_counter()
                backend.start(_request(f"direct-{i}", nodes))
                direct.append(time.perf_counter() - started)
                cluster.forget_requests()
        finally:
            backend.close()
    p50, base = median(times), median(direct)
    return Row(
        "k8s_submit_to_pods_p50",
        round(p50, 4),
        "s",
        baseline=round(base, 4),
        ratio=round(p50 / base, 2),
        detail={
            "p90": round(percentile(times, 90), 4),
            "learners": nodes,
            "repeats": repeats,
            "baseline": "the backend's start() alone (Service, Secret, pods) for the same training",
            "target": "p50 <= 0.3 s",
        },
    )


def _request(training_id: str, nodes: int = 1) -> StartRequest:
    spec = TrainingSpec(training_id, "tensorflow", "2.21", "python3 train.py", nodes)
    return StartRequest(
        spec=spec,
        model_definition_key=f"trainings/{training_id}/model_definition.zip",
        store=StoreConfig(kind="local", root="/store"),
        log_sink=LogSinkConfig(kind="file", dir="/logs"),
        results_prefix=f"trainings/{training_id}/results/",
        tenant="bench",
        max_runtime=3600,
    )


def _counting(api: client.ApiClient) -> Callable[[], int]:
    """Count the requests made through `api` (the watch's included)."""
    count = [0]
    call = api.call_api

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return call(*args, **kwargs)

    api.call_api = counted
    return lambda: count[0]


def monitor_pass(trainings: int, seconds: float) -> dict[str, float]:
    """Passes as the monitor makes them (observe every active training, then held()) over
    `seconds`, with `trainings` active ones whose pods change as passes go."""
    with emulated_cluster() as cluster:
        core = cluster.core
        api = cluster.api()
        backend = KubernetesBackend(api, CLUSTER, held_refresh_seconds=1.0)
        try:
            ids = [f"bench-{i:04d}" for i in range(trainings)]
            for i, tid in enumerate(ids):
                backend.start(_request(tid))
                if i % 20 == 19:
                    cluster.forget_requests()
            requests = _counting(api)
            before, passes, walls = requests(), 0, []
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                started = time.perf_counter()
                for tid in ids:
                    backend.observe(tid)
                backend.held()
                walls.append(time.perf_counter() - started)
                passes += 1
                # One pod changes between passes: the watch carries it, no pass asks.
                name = f"{learner_name_prefix(ids[passes % trainings])}-1"
                core.patch_namespaced_pod_status(
                    name, NAMESPACE, {"status": {"phase": "Pending", "message": str(passes)}}
                )
                time.sleep(0.05)
                if passes % 20 == 0:
                    cluster.forget_requests()
            made = requests() - before
            return {
                "requests_per_pass": made / passes,
                "pass_ms": 1000 * median(walls),
                "passes": passes,
            }
        finally:
            backend.close()
            api.close()


def monitor_cost(quick: bool) -> Row:
    seconds = 3.0 if quick else 6.0
    small, large = monitor_pass(10, seconds), monitor_pass(1000, seconds)
    small_rate, large_rate = small["requests_per_pass"], large["requests_per_pass"]
    ratio = round(large_rate / small_rate, 3) if small_rate else None
    return Row(
        "k8s_monitor_pass_requests",
        round(large["requests_per_pass"], 3),
        "API requests/pass",
        baseline=round(small["requests_per_pass"], 3),
        ratio=ratio,
        detail={
            "active_trainings": {"value": 1000, "baseline": 10},
            "pass_ms_median": {
                "1000": round(large["pass_ms"], 3),
                "10": round(small["pass_ms"], 3),
            },
            "passes": {"1000": large["passes"], "10": small["passes"]},
            "polling_would_make": "one request per active training per pass (1000 vs 10)",
            "held_refresh_seconds": 1.0,
            "target": "ratio <= 3",
        },
    )


class _Outbox:
    """The broker the monitor sends to (its sends are not what is measured)."""

    def send(self, task: str, training_id: str) -> None:
        pass


def monitor_tick(trainings: int, seconds: float) -> dict[str, float]:
    """Monitor passes over `seconds` with `trainings` RUNNING trainings (one learner each,
    its pod Running in the emulated cluster), one pod's status changing between passes."""
    from tests.k8s.kubelet import RUN, ended, kubelet

    with (
        tempfile.TemporaryDirectory(prefix="dlaas-monitor-") as tmp,
        emulated_cluster() as cluster,
    ):
        settings = Settings(
            home=Path(tmp) / "home",
            backend="kubernetes",
            k8s_namespace=NAMESPACE,
            k8s_image_prefix="bench.example.com/dlaas/",
        )
        platform = Platform.from_settings(settings)
        upgrade(platform.engine)
        platform.dispatcher = _Outbox()  # type: ignore[assignment]
        api = cluster.api()
        backend = KubernetesBackend(api, CLUSTER)
        try:
            ids = [f"bench-{i:04d}" for i in range(trainings)]
            with platform.sessions() as session:
                tenant, _ = create_tenant(session, platform.catalog, "bench", "standard")
                now = utcnow()
                for tid in ids:
                    training = Training(
                        id=tid,
                        tenant_id=tenant.id,
                        name=tid,
                        status=TrainingState.RUNNING,
                        framework_name="tensorflow",
                        framework_version="2.21",
                        compute_name="CPU",
                        nodes=1,
                        manifest={"name": tid},
                        model_definition_key=f"trainings/{tid}/model_definition.zip",
                        created_at=now,
                        started_at=now,
                        updated_at=now - timedelta(minutes=1),
                    )
                    training.learners = [
                        Learner(learner_id=1, status=TrainingState.RUNNING, updated_at=now)
                    ]
                    session.add(training)
                session.commit()
            for i, tid in enumerate(ids):
                backend.start(_request(tid))
                pod = f"{learner_name_prefix(tid)}-1"
                kubelet(cluster.core, pod, "Running", ended(0), RUN, RUN)
                if i % 20 == 19:
                    cluster.forget_requests()
            monitor = Monitor(platform, backend)
            started = time.perf_counter()
            monitor.tick()  # the first pass is a full one
            full_ms = 1000 * (time.perf_counter() - started)
            walls: list[float] = []
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                name = f"{learner_name_prefix(ids[len(walls) % trainings])}-1"
                message = {"status": {"message": f"pass {len(walls)}"}}
                cluster.core.patch_namespaced_pod_status(name, NAMESPACE, message)
                time.sleep(0.05)  # the watch carries it
                started = time.perf_counter()
                monitor.tick()
                walls.append(time.perf_counter() - started)
                if len(walls) % 20 == 0:
                    cluster.forget_requests()
            return {"pass_ms": 1000 * median(walls), "full_ms": full_ms, "passes": len(walls)}
        finally:
            backend.close()
            api.close()
            platform.close()


def monitor_pass_time(quick: bool) -> Row:
    seconds = 3.0 if quick else 6.0
    small, large = monitor_tick(10, seconds), monitor_tick(1000, seconds)
    defaults = Settings()
    between = defaults.monitor_full_pass_seconds / defaults.monitor_interval
    averaged = {
        str(n): round((r["full_ms"] + (between - 1) * r["pass_ms"]) / between, 3)
        for n, r in (("1000", large), ("10", small))
    }
    return Row(
        "k8s_monitor_pass_ms",
        round(large["pass_ms"], 3),
        "ms/pass",
        baseline=round(small["pass_ms"], 3),
        ratio=round(large["pass_ms"] / small["pass_ms"], 2),
        detail={
            "active_trainings": {"value": 1000, "baseline": 10},
            "full_pass_ms": {"1000": round(large["full_ms"], 1), "10": round(small["full_ms"], 1)},
            "averaged_with_full_passes_ms": averaged,
            "passes": {"1000": large["passes"], "10": small["passes"]},
            "database": "SQLite (the embedded default)",
            "target": "ratio <= 3",
        },
    )


def run(quick: bool) -> list[Row]:
    from benchmarks import k8s_capacity

    return [
        submit_to_pods(quick).emit(),
        monitor_cost(quick).emit(),
        monitor_pass_time(quick).emit(),
        *k8s_capacity.run(quick),
    ]


if __name__ == "__main__":
    run("--quick" in sys.argv)
