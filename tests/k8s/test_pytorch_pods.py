"""PyTorch trainings' objects through the backend and the official client against the
emulated API server: a `pytorch` training's pods run torchrun with the static rendezvous
on learner 1 (`<prefix>-1:29400`), in the runtime pytorch2.13's image, and publish the
rendezvous port in the pod and the headless Service, which the training's NetworkPolicy
lets its own pods reach; a `pytorch-ddl` training is an MPI job in the same image."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from service import runtimes
from tests.k8s.conftest import NAMESPACE
from tests.k8s.test_backend import CLUSTER, PREFIX, SELECTOR, request
from tests.k8s.test_network_policy import EGRESS, raw_policies
from worker.backends.kubernetes.backend import KubernetesBackend

IMAGE = "registry.example.com/dlaas/learner-pytorch2.13:1.0"
ENDPOINT = f"--rdzv_endpoint={PREFIX}-1:29400"


@pytest.fixture
def networking(k8s_api: client.ApiClient) -> client.NetworkingV1Api:
    return client.NetworkingV1Api(k8s_api)


@pytest.fixture
def make_backend(k8s_api: client.ApiClient) -> Iterator[Callable[..., KubernetesBackend]]:
    made: list[KubernetesBackend] = []

    def make(**kwargs: Any) -> KubernetesBackend:
        backend = KubernetesBackend(k8s_api, CLUSTER, stop_grace_seconds=1, **kwargs)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def learner_containers(core: client.CoreV1Api) -> dict[str, Any]:
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
    return {p.metadata.name: p for p in pods}


def test_a_pytorch_trainings_pods_run_torchrun_with_the_rendezvous_and_its_port(
    make_backend: Callable[..., KubernetesBackend],
    core: client.CoreV1Api,
    networking: client.NetworkingV1Api,
) -> None:
    backend = make_backend(egress=EGRESS)
    backend.start(request(framework="pytorch", nodes=2))

    pods = learner_containers(core)
    assert sorted(pods) == [f"{PREFIX}-1", f"{PREFIX}-2"]
    for i in (1, 2):
        pod = pods[f"{PREFIX}-{i}"]
        learner = pod.spec.containers[0]
        assert learner.image == IMAGE
        argv = learner.command[learner.command.index("--") + 1 :]
        assert argv == [
            "torchrun",
            "--nnodes=2",
            f"--node_rank={i - 1}",
            "--nproc_per_node=1",
            "--rdzv_backend=static",
            ENDPOINT,
            "--max_restarts=0",
            "train.py",
        ]
        assert "--wait-for" not in learner.command  # torchrun's static rendezvous waits
        assert [(p.name, p.container_port, p.protocol) for p in learner.ports] == [
            ("rendezvous", 29400, "TCP")
        ]
        env = {e.name: e.value for e in learner.env}
        assert (env["LEARNER_ID"], env["NUM_LEARNERS"]) == (str(i), "2")
        assert env["LEARNER_NAME_PREFIX"] == PREFIX
        # torchrun and python are the runtime's, from its place in the learner image.
        prefix = runtimes.in_learner_image("pytorch2.13")
        assert prefix is not None and prefix.prefix.startswith("/opt/dlaas/runtimes/pytorch2.13-")
        assert env["PATH"].startswith(f"{prefix.prefix}/bin:/opt/dlaas/venv/bin:")
        assert env["LD_LIBRARY_PATH"] == f"{prefix.prefix}/lib"
        # Every learner is primary: the training completes when every torchrun exited 0.
        assert pod.metadata.labels["dlaas.io/primary"] == "true"
        assert pod.metadata.labels["dlaas.io/role"] == "worker"
        assert (pod.spec.hostname, pod.spec.subdomain) == (pod.metadata.name, PREFIX)

    (service,) = core.list_namespaced_service(NAMESPACE, label_selector=SELECTOR).items
    assert [(p.name, p.port, p.target_port) for p in service.spec.ports] == [
        ("rendezvous", 29400, "rendezvous")
    ]
    # The policy lets the training's own pods reach each other on any port: the
    # rendezvous, and Gloo's connections between the ranks.
    (policy,) = raw_policies(networking)
    own = {"podSelector": policy["spec"]["podSelector"]}
    assert policy["spec"]["ingress"] == [{"from": [own]}]
    assert policy["spec"]["egress"][0] == {"to": [own]}
    observed = backend.observe(request(framework="pytorch").spec.training_id)
    assert observed is not None and observed.primaries == (1, 2)


def test_a_pytorch_ddl_training_is_an_mpi_job_in_the_pytorch_image(
    make_backend: Callable[..., KubernetesBackend], core: client.CoreV1Api
) -> None:
    make_backend().start(request(framework="pytorch-ddl", nodes=2))
    pods = learner_containers(core)
    launcher = pods[f"{PREFIX}-1"].spec.containers[0]
    assert launcher.image == IMAGE
    assert "mpirun" in launcher.command
    env = {e.name: e.value for e in launcher.env}
    assert env["DDL_OPTIONS"] == "-mode r:1x2"
    assert pods[f"{PREFIX}-1"].metadata.labels["dlaas.io/role"] == "mpi-launcher"
    assert pods[f"{PREFIX}-2"].metadata.labels["dlaas.io/role"] == "mpi-host"
    assert pods[f"{PREFIX}-2"].spec.containers[0].ports[0].container_port == 2022
