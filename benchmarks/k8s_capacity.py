"""Gang admission from the cluster's capacity, on the emulated cluster (nodes with
allocatable GPUs, the scheduler binding pods that fit; tests/k8s_emulator.py). Its rows are
part of `benchmarks/run.py --only k8s` (benchmarks/k8s.py runs them).

- k8s_admission_pass_ms: one admission pass (`worker.admitting.admit_queued`: the queued
  and active trainings read from the database, the backend's fit from the node watch and
  the pod watch's cache, the pass's messages written) at 1,000 nodes (2 P100s each, all but
  one GPU held by 500 running trainings' bound pods) and 500 queued trainings, against 10
  nodes and 5 (baseline); one pod changes between passes. Target: ratio <= 3.
- k8s_gpu_utilisation: a stream of mixed-size trainings (1 to 8 learners of P100 or
  P100x2, seeded) through admission (the backend's fit, service.domain.admission.admit)
  onto 32 nodes of 2 P100s (the largest training, 16 GPUs, a quarter of them; the same
  stream on 16 nodes, where it is half, in the detail); time runs in passes, a training
  runs its duration once every pod of it is bound. Value: GPUs held by bound pods over the
  GPUs free to use (the cluster's, or fewer where the queued and running trainings
  together want fewer), summed over the passes. Target: >= 0.9, every training
  completed, no pod ever Unschedulable (no deadlock).
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client

from benchmarks.common import Row, median
from service.db.models import Learner, Training, utcnow
from service.db.session import upgrade
from service.domain.admission import Candidate, admit
from service.domain.catalog import DEFAULT_CATALOG, PlanSpec
from service.domain.names import label_value
from service.domain.states import TrainingState
from service.platform import Platform
from service.settings import Settings
from service.tenants import create_tenant
from tests.k8s.cluster import GPU_TAINT, node_body
from worker.admitting import admit_queued
from worker.backends.kubernetes.backend import KubernetesBackend
from worker.backends.kubernetes.objects import TRAINING_LABEL

NAMESPACE = "dlaas"
COMPUTES = DEFAULT_CATALOG.compute_configurations
# One plan that holds nobody back: what is measured is the cluster's fit.
OPEN_PLAN = {
    "standard": PlanSpec(
        distributed=True,
        max_nodes=16,
        max_concurrent_trainings=100_000,
        max_active_nodes=1_000_000,
        predictions_per_minute=1,
    )
}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SIDECAR = {"cpu": "100m", "memory": "128Mi"}


def _add_nodes(core: client.CoreV1Api, count: int, gpus: int = 2) -> None:
    product = COMPUTES["P100"].node_selector
    for i in range(count):
        body = node_body(f"p100-{i:04d}", gpus=gpus, labels=product, taints=[GPU_TAINT])
        core.create_node(body)


def _learner_pod(training_id: str, learner: int, compute: str) -> dict[str, Any]:
    """A learner pod as the backend makes it, in what the scheduler reads: the training's
    label, its configuration's placement and requests, the agent sidecar's."""
    spec = COMPUTES[compute]
    amounts = {"cpu": str(spec.cpus), "memory": f"{spec.memory_gib}Gi"}
    amounts["nvidia.com/gpu"] = str(spec.gpus)
    agent = {"requests": SIDECAR, "limits": SIDECAR}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{training_id}-{learner}",
            "labels": {TRAINING_LABEL: label_value(training_id)},
        },
        "spec": {
            "nodeSelector": dict(spec.node_selector),
            "tolerations": [GPU_TOLERATION],
            "initContainers": [
                {"name": "agent", "image": "a", "restartPolicy": "Always", "resources": agent}
            ],
            "containers": [
                {
                    "name": "learner",
                    "image": "l",
                    "resources": {"requests": amounts, "limits": amounts},
                }
            ],
        },
    }


def _create_pods(
    core: client.CoreV1Api,
    training_id: str,
    learners: int,
    compute: str,
    nodes: list[str] | None = None,
) -> None:
    """Create the training's learner pods; bound to `nodes` (one each) where given, as
    the scheduler would have bound them (else the emulated scheduler binds them)."""
    for learner in range(1, learners + 1):
        body = _learner_pod(training_id, learner, compute)
        if nodes:
            body["spec"]["nodeName"] = nodes[learner - 1]
        core.create_namespaced_pod(NAMESPACE, body)


def _until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("the emulated cluster did not settle in time")
        time.sleep(0.02)


def _all_bound(backend: KubernetesBackend, learners: dict[str, int]) -> bool:
    """Whether the watch has every pod of these trainings (id: learners) on a node."""
    for training_id, count in learners.items():
        pods = backend.watch.pods(label_value(training_id)).live.values()
        if len(pods) != count or not all((p.get("spec") or {}).get("nodeName") for p in pods):
            return False
    return True


def _all_ended(backend: KubernetesBackend, training_ids: list[str]) -> bool:
    return all(
        (p.get("status") or {}).get("phase") == "Succeeded"
        for t in training_ids
        for p in backend.watch.pods(label_value(t)).live.values()
    )


@contextmanager
def _platform(tmp: str) -> Iterator[Platform]:
    settings = Settings(home=Path(tmp) / "home", backend="kubernetes", k8s_namespace=NAMESPACE)
    platform = Platform.from_settings(settings)
    upgrade(platform.engine)
    try:
        yield platform
    finally:
        platform.close()


def _training(tid: str, tenant: str, status: TrainingState, learners: int, at: Any) -> Training:
    training = Training(
        id=tid,
        tenant_id=tenant,
        name=tid,
        status=status,
        framework_name="tensorflow",
        framework_version="2.21",
        compute_name="P100",
        nodes=learners,
        manifest={"name": tid},
        model_definition_key=f"trainings/{tid}/model_definition.zip",
        created_at=at,
        updated_at=at,
    )
    if status == TrainingState.RUNNING:
        training.learners = [
            Learner(learner_id=i, status=TrainingState.RUNNING, updated_at=at)
            for i in range(1, learners + 1)
        ]
    return training


def _fill(platform: Platform, running: dict[str, int], queued: int) -> None:
    """The running trainings (id: learners) and `queued` queued ones (2 to 4 learners,
    the oldest first) in the database."""
    with platform.sessions() as session:
        tenant, _ = create_tenant(session, platform.catalog, "bench", "standard")
        now = utcnow()
        for tid, learners in running.items():
            session.add(_training(tid, tenant.id, TrainingState.RUNNING, learners, now))
        for i in range(queued):
            at = now + timedelta(microseconds=i + 1)
            session.add(_training(f"q-{i:04d}", tenant.id, TrainingState.QUEUED, 2 + i % 3, at))
        session.commit()


def admission_pass(nodes: int, queued: int, seconds: float) -> dict[str, Any]:
    """The median wall time of admit_queued over `seconds` of passes, on `nodes` nodes of
    2 P100s with every GPU but one held by nodes/2 running trainings' bound pods, and
    `queued` queued trainings (2 to 4 learners) of which the first cannot fit."""
    from benchmarks.k8s import CLUSTER, emulated_cluster

    half = nodes // 2
    running = {f"run-{i:04d}": 3 if i == half - 1 else 4 for i in range(half)}
    with tempfile.TemporaryDirectory(prefix="dlaas-admit-") as tmp, emulated_cluster() as cluster:
        _add_nodes(cluster.core, nodes)
        with _platform(tmp) as platform:
            _fill(platform, running, queued)
            placed = 0  # the running learners fill the nodes in order, 2 a node
            for i, (tid, learners) in enumerate(running.items()):
                on = [f"p100-{(placed + k) // 2:04d}" for k in range(learners)]
                _create_pods(cluster.core, tid, learners, "P100", on)
                placed += learners
                if i % 10 == 9:
                    cluster.forget_requests()
            api = cluster.api()
            backend = KubernetesBackend(api, CLUSTER)
            try:
                backend.watch.ensure_started()
                _until(lambda: _all_bound(backend, running))
                outbox: list[tuple[str, str]] = []
                walls: list[float] = []
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline or len(walls) < 5:
                    pod = f"run-{len(walls) % half:04d}-1"
                    change = {"status": {"message": f"pass {len(walls)}"}}
                    cluster.core.patch_namespaced_pod_status(pod, NAMESPACE, change)
                    time.sleep(0.05)  # the watch carries it
                    with platform.sessions() as session:
                        started = time.perf_counter()
                        admit_queued(session, OPEN_PLAN, backend, outbox, COMPUTES)
                        session.commit()
                        walls.append(time.perf_counter() - started)
                    if len(walls) % 20 == 0:
                        cluster.forget_requests()
                if outbox:
                    raise RuntimeError(f"admitted on a full cluster: {outbox[:3]}")
                with platform.sessions() as session:
                    first = session.get(Training, "q-0000")
                    message = first.status_message if first else None
                return {"pass_ms": 1000 * median(walls), "passes": len(walls), "message": message}
            finally:
                backend.close()
                api.close()


def admission_pass_time(quick: bool) -> Row:
    seconds = 2.0 if quick else 5.0
    small = admission_pass(10, 5, seconds)
    large = admission_pass(1000, 500, seconds)
    return Row(
        "k8s_admission_pass_ms",
        round(large["pass_ms"], 3),
        "ms/pass",
        baseline=round(small["pass_ms"], 3),
        ratio=round(large["pass_ms"] / small["pass_ms"], 2),
        detail={
            "nodes": {"value": 1000, "baseline": 10},
            "queued_trainings": {"value": 500, "baseline": 5},
            "running_trainings": {"value": 500, "baseline": 5},
            "passes": {"1000": large["passes"], "10": small["passes"]},
            "first_queued_message": large["message"],
            "database": "SQLite (the embedded default)",
            "target": "ratio <= 3",
        },
    )


def _stream(trainings: int, seed: int) -> list[tuple[str, int, str, int]]:
    """(id, learners, compute configuration, passes it runs) of each training, seeded."""
    rng = random.Random(seed)  # noqa: S311 (a reproducible workload, not a secret)
    return [
        (
            f"s-{i:03d}",
            rng.choice((1, 1, 2, 2, 3, 4, 6, 8)),
            rng.choice(("P100", "P100", "P100x2")),
            rng.randint(3, 12),
        )
        for i in range(trainings)
    ]


def utilisation(trainings: int, nodes: int = 16, seed: int = 24) -> dict[str, Any]:
    """Run a seeded stream of mixed-size trainings to the end; see the module's text."""
    from benchmarks.k8s import CLUSTER, emulated_cluster

    stream = _stream(trainings, seed)
    gpus_of = {tid: n * COMPUTES[c].gpus for tid, n, c, _ in stream}
    duration = {tid: d for tid, _, _, d in stream}
    tenants = {f"tenant-{i}": 10**6 for i in range(7)}
    total = nodes * 2
    with emulated_cluster() as cluster:
        _add_nodes(cluster.core, nodes)
        api = cluster.api()
        backend = KubernetesBackend(api, CLUSTER)
        try:
            backend.watch.ensure_started()
            queued = [
                Candidate(t, f"tenant-{i % 7}", n, c) for i, (t, n, c, _) in enumerate(stream)
            ]
            active: dict[str, Candidate] = {}
            ends: dict[str, int] = {}
            busy_sum = usable_sum = unschedulable = tick = 0
            while queued or active:
                tick += 1
                if tick > 50 * trainings:
                    raise RuntimeError("deadlock: the stream did not drain")
                done = [t for t, end in ends.items() if end <= tick]
                for tid in done:
                    for learner in range(1, active[tid].nodes + 1):
                        ended = {"status": {"phase": "Succeeded"}}
                        cluster.core.patch_namespaced_pod_status(
                            f"{tid}-{learner}", NAMESPACE, ended
                        )
                    del active[tid], ends[tid]
                # The watch has seen them end (a monitor's pass would have recorded it).
                _until(lambda done=done: _all_ended(backend, done))  # type: ignore[misc]
                fit = backend.fit(list(active.values()), COMPUTES)
                if fit is None:
                    raise RuntimeError("the backend did not read the nodes")
                result = admit(
                    queued,
                    active_per_tenant={},
                    concurrency_per_tenant=tenants,
                    free_slots=0,
                    fit=fit,
                )
                for tid in result.started:
                    (candidate,) = [q for q in queued if q.training_id == tid]
                    queued.remove(candidate)
                    active[tid] = candidate
                    _create_pods(cluster.core, tid, candidate.nodes, candidate.compute)
                    ends[tid] = tick + duration[tid]
                # Every admitted gang is bound whole: none of its pods waits.
                _until(lambda: _all_bound(backend, {t: c.nodes for t, c in active.items()}))
                unschedulable += sum(
                    c.reason == "Unschedulable"
                    for p in cluster.core.list_namespaced_pod(NAMESPACE).items
                    for c in p.status.conditions or []
                )
                busy = sum(gpus_of[t] for t in active)
                busy_sum += busy
                usable_sum += min(total, busy + sum(gpus_of[q.training_id] for q in queued))
                if tick % 10 == 0:
                    cluster.forget_requests()
            return {
                "utilisation": busy_sum / usable_sum,
                "passes": tick,
                "unschedulable_pods": unschedulable,
                "trainings": trainings,
                "gpus": total,
            }
        finally:
            backend.close()
            api.close()


def gpu_utilisation(quick: bool) -> Row:
    trainings = 40 if quick else 80
    result = utilisation(trainings, nodes=32)
    # The same stream where its largest training (16 GPUs) is half the cluster.
    small = utilisation(trainings, nodes=16)
    return Row(
        "k8s_gpu_utilisation",
        round(result["utilisation"], 3),
        "GPUs busy / GPUs free to use",
        detail={
            "trainings": result["trainings"],
            "cluster_gpus": result["gpus"],
            "passes": result["passes"],
            "unschedulable_pods": result["unschedulable_pods"],
            "sizes": "1-8 learners of P100 (1 GPU) or P100x2 (2 GPUs), 3-12 passes each, seed 24",
            "on_32_gpus": {
                "utilisation": round(small["utilisation"], 3),
                "passes": small["passes"],
                "unschedulable_pods": small["unschedulable_pods"],
            },
            "target": ">= 0.9, every training completed, no pod Unschedulable",
        },
    )


def run(quick: bool) -> list[Row]:
    return [admission_pass_time(quick).emit(), gpu_utilisation(quick).emit()]


if __name__ == "__main__":
    run("--quick" in sys.argv)
