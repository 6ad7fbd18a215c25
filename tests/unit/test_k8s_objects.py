"""The Kubernetes objects of a training, table-tested without a cluster: every object
passes the API's schema in strict mode (kubernetes-validate), and the fields the learner
contract depends on (names, DNS, labels, environment, ports, resources, placement,
deadline, where credentials are mounted) are what they must be."""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass, replace
from typing import Any

import kubernetes_validate
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from pydantic import ValidationError

from service.domain.catalog import DEFAULT_CATALOG, ComputeSpec, Toleration
from service.domain.names import is_dns_label, is_label_value
from service.domain.records import Secret
from service.logs.config import LogSinkConfig
from service.settings import Settings
from service.storage.config import BucketLocation, StoreConfig
from worker.backends.kubernetes import layout
from worker.backends.kubernetes.objects import (
    DEADLINE_MARGIN_SECONDS,
    ClusterConfig,
    Owner,
    SshKeyPair,
    TrainingObjectsInput,
    training_objects,
)
from worker.launchers import plan_launch
from worker.launchers.plan import (
    DLAAS_CONVENTIONS,
    FFDL_CONVENTIONS,
    Addressing,
    TrainingSpec,
    first_host_index,
    learner_name_prefix,
)
from worker.learner.spec import LearnerSpec

# Versions whose schemas kubernetes-validate ships: native sidecars (an init container's
# restartPolicy) are in the API since 1.28, on by default since 1.29, GA in 1.33.
VERSIONS = ("1.30.0", "1.33.0", kubernetes_validate.latest_version())

STORE_KEY, STORE_SECRET = "AKIAPLATFORM", "platform-secret-value"
USER_KEY, USER_SECRET = "AKIAUSERDATA", "user-secret-value"
CREDENTIALS = (STORE_KEY, STORE_SECRET, USER_KEY, USER_SECRET)
# A real key pair, as the backend makes one per MPI training.
_KEY = ed25519.Ed25519PrivateKey.generate()
PRIVATE_KEY = _KEY.private_bytes(
    serialization.Encoding.PEM,
    serialization.PrivateFormat.OpenSSH,
    serialization.NoEncryption(),
).decode()
PUBLIC_KEY = (
    _KEY.public_key()
    .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    .decode()
)
CPU = ComputeSpec(gpus=0, cpus=2, memory_gib=4, supports_distributed=True)
OWNER = Owner(name="learner-abc123def456", uid="6f1c3a4e-0b7d-4b8e-9d7a-2a1b3c4d5e6f")
CLUSTER = ClusterConfig.from_settings(
    Settings(k8s_namespace="dlaas-jobs", k8s_image_prefix="registry.example.com/dlaas/")
)


def learner_spec_json(training_id: str, learner_id: int, nodes: int, env: dict[str, str]) -> str:
    """A learner's spec as the backend writes it: the pod's directories, credentials in clear."""
    dirs = layout.DIRECTORIES
    return LearnerSpec(
        training_id=training_id,
        learner_id=learner_id,
        num_learners=nodes,
        hostname=f"{learner_name_prefix(training_id)}-{learner_id}",
        argv=["python3", "train.py"],
        env={**env, **dirs},
        model_dir=dirs["MODEL_DIR"],
        data_dir=dirs["DATA_DIR"],
        result_dir=dirs["RESULT_DIR"],
        log_dir=dirs["LOG_DIR"],
        checkpoint_dir=dirs["CHECKPOINT_DIR"],
        model_definition_key=f"trainings/{training_id}/model_definition.zip",
        store=StoreConfig(
            kind="s3",
            endpoint="http://minio.dlaas:9000",
            access_key=Secret(STORE_KEY),
            secret_key=Secret(STORE_SECRET),
            bucket="dlaas",
        ),
        log_sink=LogSinkConfig(kind="redis", url="redis://redis.dlaas:6379/1"),
        results_prefix=f"trainings/{training_id}/results/",
        training_data=BucketLocation(
            store=StoreConfig(
                kind="s3",
                endpoint="http://minio.dlaas:9000",
                access_key=Secret(USER_KEY),
                secret_key=Secret(USER_SECRET),
                bucket="mnist",
            ),
        ),
    ).to_json()


@dataclass(frozen=True)
class Case:
    framework: str
    nodes: int
    compute: ComputeSpec
    ps: int = 0
    tenant: str = "acme"
    runtime: str = "platform"
    training_id: str = "abc123def456"
    conventions: str = DLAAS_CONVENTIONS

    @property
    def distribution(self) -> str:
        return "parameter_server" if self.framework == "tensorflow" else "mpi"

    def inputs(self) -> TrainingObjectsInput:
        spec = TrainingSpec(
            training_id=self.training_id,
            framework=self.framework,
            version="2.21",
            command="python3 train.py --steps 5",
            nodes=self.nodes,
            parameter_servers=self.ps,
            gpus_per_node=self.compute.gpus,
            distribution=self.distribution,
            cpus=self.compute.cpus,
            memory_gib=self.compute.memory_gib,
            conventions=self.conventions,
        )
        prefix = learner_name_prefix(self.training_id)
        mpi = layout.mpi_setup(self.conventions) if self.distribution == "mpi" else None
        first = first_host_index(self.conventions)
        plan = plan_launch(spec, Addressing.per_learner_hosts(prefix, self.nodes, first), mpi)
        return TrainingObjectsInput(
            training_id=self.training_id,
            tenant=self.tenant,
            plan=plan,
            learner_specs={
                lp.learner_id: learner_spec_json(
                    self.training_id, lp.learner_id, self.nodes, dict(lp.env)
                )
                for lp in plan.learners
            },
            runtime=self.runtime,
            compute=self.compute,
            max_runtime=3600,
            distribution=self.distribution,
            owner=OWNER,
            ssh=SshKeyPair(PRIVATE_KEY, PUBLIC_KEY) if self.distribution == "mpi" else None,
        )

    def objects(self, cluster: ClusterConfig = CLUSTER) -> list[dict[str, Any]]:
        return training_objects(self.inputs(), cluster)


GPU_TOLERATIONS = (
    Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
    Toleration(
        key="dlaas.io/preemptible",
        operator="Equal",
        value="yes",
        effect="NoExecute",
        toleration_seconds=60,
    ),
)
CASES = {
    "single": Case("tensorflow", 1, CPU),
    "parameter-server": Case("tensorflow", 3, CPU, ps=1),
    "mpi": Case(
        "tensorflow-horovod",
        2,
        DEFAULT_CATALOG.compute_configurations["P100x2"],
        runtime="horovod-tf2.14",
    ),
    "gpu": Case(
        "tensorflow",
        1,
        DEFAULT_CATALOG.compute_configurations["P100"].model_copy(
            update={"tolerations": GPU_TOLERATIONS}
        ),
    ),
    "ffdl-parameter-server": Case("tensorflow", 2, CPU, ps=1, conventions=FFDL_CONVENTIONS),
    "ffdl-mpi": Case(
        "tensorflow-horovod",
        2,
        DEFAULT_CATALOG.compute_configurations["P100x2"],
        runtime="horovod-tf2.14",
        conventions=FFDL_CONVENTIONS,
    ),
}


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def pods(case: str) -> list[dict[str, Any]]:
    return of_kind(CASES[case].objects(), "Pod")


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    found = [
        c for c in pod["spec"]["containers"] + pod["spec"]["initContainers"] if c["name"] == name
    ]
    assert len(found) == 1
    return found[0]


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


# -- the API's schema ------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_object_passes_strict_validation(case: str, version: str) -> None:
    objects = CASES[case].objects()
    assert [o["kind"] for o in objects] == ["Secret", "Service"] + ["Pod"] * CASES[case].nodes
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda pod: pod["spec"].__setitem__("hostName", "x"),  # misspelt field
        lambda pod: pod["spec"]["containers"][0].__setitem__("ports", [{"containerPort": "a"}]),
        lambda pod: pod["spec"].__setitem__("restartPolicy", 1),
    ],
)
def test_the_strict_validation_refuses_a_broken_pod(break_it: Any) -> None:
    pod = copy.deepcopy(pods("single")[0])
    break_it(pod)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, VERSIONS[-1], strict=True)


# -- names and DNS -----------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_names_hostnames_and_dns_search(case: str) -> None:
    objects = CASES[case].objects()
    prefix = "learner-abc123def456"
    (service,) = of_kind(objects, "Service")
    assert service["metadata"]["name"] == prefix
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    first = first_host_index(CASES[case].conventions)  # 0 under FfDL's conventions
    for i, pod in enumerate(of_kind(objects, "Pod"), start=first):
        spec = pod["spec"]
        assert pod["metadata"]["name"] == spec["hostname"] == f"{prefix}-{i}"
        assert spec["subdomain"] == prefix
        assert spec["dnsConfig"] == {"searches": [f"{prefix}.dlaas-jobs.svc.cluster.local"]}
        assert is_dns_label(spec["hostname"]) and is_dns_label(spec["subdomain"])
        assert pod["metadata"]["namespace"] == "dlaas-jobs"
        env = env_of(container(pod, "learner"))
        assert env["LEARNER_NAME_PREFIX"] == prefix
        host_number = int(env["LEARNER_ID"]) - 1 + first
        assert f"{env['LEARNER_NAME_PREFIX']}-{host_number}" == spec["hostname"]


@pytest.mark.parametrize(
    ("training_id", "expected"),
    [
        ("abc123def456", "learner-abc123def456"),
        ("ABC_123", "learner-abc-123-"),  # changed: a hash follows
        ("x" * 80, "learner-xxxx"),
    ],
)
def test_the_prefix_is_a_stable_dns_label(training_id: str, expected: str) -> None:
    prefix = learner_name_prefix(training_id)
    assert prefix.startswith(expected)
    assert prefix == learner_name_prefix(training_id)
    assert len(prefix) <= 57 and is_dns_label(f"{prefix}-99999")
    if training_id != "abc123def456":
        assert prefix != learner_name_prefix(training_id + "y")


def test_a_long_training_id_still_gives_valid_objects() -> None:
    case = replace(CASES["parameter-server"], training_id="T" * 70, tenant="A tenant/with spaces")
    for obj in case.objects():
        kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)
        for value in obj["metadata"]["labels"].values():
            assert is_label_value(value)
        if obj["kind"] == "Pod":
            assert is_dns_label(obj["spec"]["hostname"])


# -- labels and ownership ------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_labels_select_the_learners_and_every_object_is_owned(case: str) -> None:
    objects = CASES[case].objects()
    (service,) = of_kind(objects, "Service")
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["dlaas.io/training-id"] == "abc123def456"
        assert labels["dlaas.io/tenant"] == "acme"
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": OWNER.name,
                "uid": OWNER.uid,
                "controller": True,
            }
        ]
    for i, pod in enumerate(of_kind(objects, "Pod"), start=1):
        labels = pod["metadata"]["labels"]
        assert labels["dlaas.io/learner-id"] == str(i)
        assert labels["dlaas.io/attempt"] == "1"
        assert service["spec"]["selector"].items() <= labels.items()


@pytest.mark.parametrize(
    ("case", "roles"),
    [
        ("single", [("single", "true")]),
        ("parameter-server", [("ps", "false"), ("worker", "true"), ("worker", "true")]),
        ("mpi", [("mpi-launcher", "true"), ("mpi-host", "false")]),
    ],
)
def test_roles_and_primaries_are_labelled(case: str, roles: list[tuple[str, str]]) -> None:
    found = [
        (p["metadata"]["labels"]["dlaas.io/role"], p["metadata"]["labels"]["dlaas.io/primary"])
        for p in pods(case)
    ]
    assert found == roles


def test_a_tenant_name_that_is_no_label_value_is_made_one() -> None:
    tenant = "team-" + "x" * 70 + "."
    objects = replace(CASES["single"], tenant=tenant).objects()
    values = {o["metadata"]["labels"]["dlaas.io/tenant"] for o in objects}
    assert len(values) == 1
    (value,) = values
    assert is_label_value(value) and value.startswith("team-xxx")
    other = replace(CASES["single"], tenant=tenant + "y").objects()
    assert other[0]["metadata"]["labels"]["dlaas.io/tenant"] != value


# -- environment ---------------------------------------------------------------------------


def test_environment_of_a_parameter_server_training() -> None:
    prefix = "learner-abc123def456"
    cluster = {
        "ps": [f"{prefix}-1:2222"],
        "worker": [f"{prefix}-2:2222", f"{prefix}-3:2222"],
    }
    tasks = [("ps", 0), ("worker", 0), ("worker", 1)]
    for i, (pod, (kind, index)) in enumerate(zip(pods("parameter-server"), tasks, strict=True), 1):
        env = env_of(container(pod, "learner"))
        assert env == {
            "TRAINING_ID": "abc123def456",
            "LEARNER_ID": str(i),
            "NUM_LEARNERS": "3",
            "LEARNER_NAME_PREFIX": prefix,
            "GPU_COUNT": "0",
            "PS_HOSTS_COUNT": "1",
            "TF_CONFIG": json.dumps(
                {"cluster": cluster, "task": {"type": kind, "index": index}},
                separators=(",", ":"),
            ),
            **layout.DIRECTORIES,
        }
        assert container(pod, "learner")["workingDir"] == layout.DIRECTORIES["MODEL_DIR"]


@pytest.mark.parametrize(
    ("case", "gpu_count", "launcher_extra"),
    [
        (CASES["single"], "0", set()),
        (CASES["gpu"], "1", set()),
        (CASES["mpi"], "2", set()),
        (
            replace(CASES["mpi"], framework="tensorflow-ddl", runtime="ddl-tf2.14"),
            "2",
            {"DDL_OPTIONS"},
        ),
    ],
)
def test_environment_contract(case: Case, gpu_count: str, launcher_extra: set[str]) -> None:
    contract = {"TRAINING_ID", "LEARNER_ID", "NUM_LEARNERS", "LEARNER_NAME_PREFIX", "GPU_COUNT"}
    for i, pod in enumerate(of_kind(case.objects(), "Pod"), start=1):
        env = env_of(container(pod, "learner"))
        extra = launcher_extra if i == 1 else set()
        assert set(env) == contract | set(layout.DIRECTORIES) | extra
        assert env["LEARNER_ID"] == str(i) and env["GPU_COUNT"] == gpu_count
        assert env["NUM_LEARNERS"] == str(case.nodes)
        assert env["TRAINING_ID"] == "abc123def456"


# -- ports, resources, placement, lifetime --------------------------------------------------


@pytest.mark.parametrize(
    ("case", "port"),
    [
        ("single", {"name": "grpc", "containerPort": 2222, "protocol": "TCP"}),
        ("parameter-server", {"name": "grpc", "containerPort": 2222, "protocol": "TCP"}),
        ("gpu", {"name": "grpc", "containerPort": 2222, "protocol": "TCP"}),
        ("mpi", {"name": "ssh", "containerPort": layout.SSH_PORT, "protocol": "TCP"}),
    ],
)
def test_ports(case: str, port: dict[str, Any]) -> None:
    objects = CASES[case].objects()
    (service,) = of_kind(objects, "Service")
    assert service["spec"]["ports"] == [
        {
            "name": port["name"],
            "port": port["containerPort"],
            "targetPort": port["name"],
            "protocol": "TCP",
        }
    ]
    for pod in of_kind(objects, "Pod"):
        assert container(pod, "learner")["ports"] == [port]
        assert "ports" not in container(pod, "fetch") and "ports" not in container(pod, "agent")


@pytest.mark.parametrize(
    ("case", "gpu_resource", "amounts"),
    [
        ("single", "nvidia.com/gpu", {"cpu": "2", "memory": "4Gi"}),
        ("gpu", "nvidia.com/gpu", {"cpu": "8", "memory": "24Gi", "nvidia.com/gpu": "1"}),
        ("gpu", "amd.com/gpu", {"cpu": "8", "memory": "24Gi", "amd.com/gpu": "1"}),
        ("mpi", "nvidia.com/gpu", {"cpu": "16", "memory": "48Gi", "nvidia.com/gpu": "2"}),
    ],
)
def test_resources_come_from_the_compute_configuration(
    case: str, gpu_resource: str, amounts: dict[str, str]
) -> None:
    cluster = replace(CLUSTER, gpu_resource=gpu_resource)
    for pod in of_kind(CASES[case].objects(cluster), "Pod"):
        learner = container(pod, "learner")
        assert learner["resources"] == {"requests": amounts, "limits": amounts}
        for name in ("fetch", "agent"):
            assert gpu_resource not in container(pod, name)["resources"]["limits"]


def test_placement_of_a_gpu_configuration() -> None:
    (pod,) = pods("gpu")
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-P100-PCIE-16GB"}
    assert pod["spec"]["tolerations"] == [
        {"operator": "Exists", "key": "nvidia.com/gpu", "effect": "NoSchedule"},
        {
            "operator": "Equal",
            "key": "dlaas.io/preemptible",
            "value": "yes",
            "effect": "NoExecute",
            "tolerationSeconds": 60,
        },
    ]
    (cpu_pod,) = pods("single")
    assert "nodeSelector" not in cpu_pod["spec"] and "tolerations" not in cpu_pod["spec"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_pod_lifetime_and_privileges(case: str) -> None:
    for pod in pods(case):
        spec = pod["spec"]
        assert spec["restartPolicy"] == "Never"
        assert spec["activeDeadlineSeconds"] == 3600 + DEADLINE_MARGIN_SECONDS
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert "imagePullSecrets" not in spec
        for c in spec["containers"] + spec["initContainers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_images_and_pull_secrets_come_from_the_cluster_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DLAAS_K8S_NAMESPACE", "ml")
    monkeypatch.setenv("DLAAS_K8S_IMAGE_PREFIX", "reg.local:5000/team/")
    monkeypatch.setenv("DLAAS_K8S_IMAGE_TAG", "1.2.3")
    monkeypatch.setenv("DLAAS_K8S_IMAGE_PULL_SECRETS", "regcred, other ,")
    monkeypatch.setenv("DLAAS_K8S_GPU_RESOURCE", "gpu.example.com/device")
    monkeypatch.setenv("DLAAS_K8S_CLUSTER_DOMAIN", "k8s.example.org")
    cluster = ClusterConfig.from_settings(Settings())
    assert cluster.pull_secrets == ("regcred", "other")
    objects = CASES["mpi"].objects(cluster)
    for pod in of_kind(objects, "Pod"):
        assert pod["metadata"]["namespace"] == "ml"
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
        assert (
            container(pod, "learner")["image"] == "reg.local:5000/team/learner-horovod-tf2.14:1.2.3"
        )
        assert container(pod, "fetch")["image"] == "reg.local:5000/team/platform:1.2.3"
        assert container(pod, "agent")["image"] == "reg.local:5000/team/platform:1.2.3"
        assert container(pod, "learner")["resources"]["limits"]["gpu.example.com/device"] == "2"
        assert pod["spec"]["dnsConfig"]["searches"] == [
            "learner-abc123def456.ml.svc.k8s.example.org"
        ]
        kubernetes_validate.validate(pod, VERSIONS[-1], strict=True)


# -- the privilege split: fetch, agent, learner ---------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_fetch_then_agent_sidecar_then_the_learner(case: str) -> None:
    for i, pod in enumerate(pods(case), start=1):
        fetch, agent = pod["spec"]["initContainers"]
        spec_path = f"/var/run/dlaas/spec/learner-{i}.json"
        assert fetch["name"] == "fetch" and "restartPolicy" not in fetch
        # Isolated (-I): neither the working directory (MODEL_DIR), PYTHONPATH nor the
        # user site directory under the tenant's HOME is on the steps' path.
        pod_step = ["python", "-I", "-m", "worker.learner.pod"]
        assert fetch["command"] == [*pod_step, "fetch", spec_path]
        assert agent["name"] == "agent" and agent["restartPolicy"] == "Always"
        assert agent["command"][:6] == [*pod_step, "agent", spec_path]
        (learner,) = pod["spec"]["containers"]
        assert learner["name"] == "learner"
        assert learner["command"][:5] == [*pod_step, "run"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_only_fetch_and_agent_mount_the_learners_own_spec(case: str) -> None:
    for i, pod in enumerate(pods(case), start=1):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        spec_volume = volumes["spec"]["secret"]
        assert spec_volume["secretName"] == "learner-abc123def456-secret"
        assert spec_volume["items"] == [{"key": f"learner-{i}.json", "path": f"learner-{i}.json"}]
        for name in ("fetch", "agent"):
            mounts = {m["name"]: m for m in container(pod, name)["volumeMounts"]}
            assert mounts["spec"] == {
                "name": "spec",
                "mountPath": "/var/run/dlaas/spec",
                "readOnly": True,
            }
        learner_mounts = {m["name"] for m in container(pod, "learner")["volumeMounts"]}
        assert "spec" not in learner_mounts
        for name in learner_mounts:
            volume = volumes[name]
            if "emptyDir" in volume:
                continue
            # Only MPI jobs mount anything else into the learner: the key pair, the hostfile.
            assert CASES[case].distribution == "mpi"
            keys = {item["key"] for item in volume["secret"]["items"]}
            assert keys <= {*layout.SSH_KEY_NAMES, "hostfile"}
            assert volume["secret"]["defaultMode"] == 0o400


@pytest.mark.parametrize("case", sorted(CASES))
def test_credentials_are_only_in_the_secret(case: str) -> None:
    objects = CASES[case].objects()
    for obj in objects:
        text = json.dumps(obj)
        for credential in CREDENTIALS:
            assert credential not in text  # base64 in the Secret, nowhere else at all
        if obj["kind"] == "Secret":
            continue
        assert PRIVATE_KEY.splitlines()[1] not in text
        for pod_container in obj.get("spec", {}).get("containers", []):
            for e in pod_container.get("env", []):
                assert "valueFrom" not in e
    (secret,) = of_kind(objects, "Secret")
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    for i in range(1, CASES[case].nodes + 1):
        spec = json.loads(base64.b64decode(secret["data"][f"learner-{i}.json"]))
        assert spec["learner_id"] == i
        assert spec["store"]["secret_key"] == STORE_SECRET
        assert spec["model_dir"] == layout.DIRECTORIES["MODEL_DIR"]


def test_mpi_launcher_waits_for_the_ssh_hosts() -> None:
    launcher, host = pods("mpi")
    (secret,) = of_kind(CASES["mpi"].objects(), "Secret")
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded["id_ed25519"] == PRIVATE_KEY
    assert decoded["id_ed25519.pub"] == decoded["authorized_keys"] == PUBLIC_KEY + "\n"
    assert decoded["hostfile"] == (
        "learner-abc123def456-1 slots=2\nlearner-abc123def456-2 slots=2\n"
    )

    command = container(launcher, "learner")["command"]
    split = command.index("--")
    assert command[5:split] == [
        "--io",
        layout.IO_DIR,
        "--wait-for",
        f"learner-abc123def456-2:{layout.SSH_PORT}",
    ]
    argv = command[split + 1 :]
    assert argv[:4] == ["mpirun", "-np", "4", "--hostfile"]
    assert argv[4] == layout.HOSTFILE_PATH
    launcher_mounts = {
        m["name"]: m["mountPath"] for m in container(launcher, "learner")["volumeMounts"]
    }
    assert launcher_mounts["mpi"] == layout.MPI_DIR and launcher_mounts["ssh"] == layout.SSH_DIR

    host_learner = container(host, "learner")
    argv = host_learner["command"][host_learner["command"].index("--") + 1 :]
    assert argv == list(layout.mpi_host_argv())
    assert argv[4:9] == ["/usr/sbin/sshd", "-D", "-e", "-f", layout.SSHD_CONFIG]
    assert host_learner["readinessProbe"]["tcpSocket"] == {"port": "ssh"}
    host_mounts = {m["name"] for m in host_learner["volumeMounts"]}
    assert "ssh" in host_mounts and "mpi" not in host_mounts
    for pod in (launcher, host):
        for name in ("fetch", "agent"):
            assert "ssh" not in {m["name"] for m in container(pod, name)["volumeMounts"]}


# -- refused inputs ----------------------------------------------------------------------------


def test_an_mpi_training_needs_its_key_pair() -> None:
    with pytest.raises(ValueError, match="SSH key pair"):
        training_objects(replace(CASES["mpi"].inputs(), ssh=None), CLUSTER)


def test_every_learner_needs_its_spec() -> None:
    inp = CASES["parameter-server"].inputs()
    with pytest.raises(ValueError, match="learner specs"):
        training_objects(replace(inp, learner_specs={1: "{}", 2: "{}"}), CLUSTER)


def test_the_plan_must_use_the_prefix_for_host_names() -> None:
    case = CASES["single"]
    inp = case.inputs()
    spec = TrainingSpec("abc123def456", "tensorflow", "2.21", "true", 1)
    other = plan_launch(spec, Addressing.per_learner_hosts("learner-other", 1), None)
    with pytest.raises(ValueError, match="host name"):
        training_objects(replace(inp, plan=other), CLUSTER)


def test_an_oversized_secret_is_refused() -> None:
    inp = CASES["single"].inputs()
    with pytest.raises(ValueError, match="over 1 MiB"):
        training_objects(replace(inp, learner_specs={1: "x" * (1024 * 1024)}), CLUSTER)


def test_the_cluster_defaults() -> None:
    cluster = ClusterConfig.from_settings(Settings())
    assert cluster.learner_image("horovod-tf2.14") == "ghcr.io/dlaas/learner-horovod-tf2.14:latest"
    assert cluster.platform_image == "ghcr.io/dlaas/platform:latest"
    assert (cluster.namespace, cluster.gpu_resource) == ("dlaas", "nvidia.com/gpu")
    assert (cluster.pull_secrets, cluster.cluster_domain) == ((), "cluster.local")
    assert Settings().k8s_pod_ttl_seconds == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DLAAS_K8S_NAMESPACE", "Not_A_Label"),
        ("DLAAS_K8S_POD_TTL_SECONDS", "-1"),
        ("DLAAS_K8S_GPU_RESOURCE", "gpu"),
        ("DLAAS_K8S_GPU_RESOURCE", "nvidia.com/gpu!"),
        ("DLAAS_K8S_IMAGE_PULL_SECRETS", "regcred,Bad Name"),
    ],
)
def test_bad_cluster_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize(
    ("case", "names"),
    [
        ("parameter-server", ["learner-abc123def456-1", "learner-abc123def456-2"]),
        ("ffdl-parameter-server", ["learner-abc123def456-0", "learner-abc123def456-1"]),
        ("ffdl-mpi", ["learner-abc123def456-0", "learner-abc123def456-1"]),
    ],
)
def test_pods_are_named_as_the_conventions_name_learners(case: str, names: list[str]) -> None:
    """FfDL's conventions: learner i's pod (and host) is `<prefix>-<i-1>`, from 0, in the
    Service `<prefix>`, so `<prefix>-0.<prefix>` is learner 1; LEARNER_ID is still i."""
    found = sorted(pods(case), key=lambda p: int(p["metadata"]["labels"]["dlaas.io/learner-id"]))
    assert [p["metadata"]["name"] for p in found][: len(names)] == names
    assert [p["spec"]["hostname"] for p in found][: len(names)] == names
    assert {p["spec"]["subdomain"] for p in found} == {"learner-abc123def456"}
    for i, pod in enumerate(found, 1):
        env = env_of(container(pod, layout.LEARNER_CONTAINER))
        assert env["LEARNER_ID"] == str(i)
        if case.startswith("ffdl"):
            assert env["JOB_STATE_DIR"] == "/job"
            assert env["DLAAS_JOB_ID"] == "abc123def456"
            assert env["DOWNWARD_API_POD_NAME"] == pod["metadata"]["name"]
        else:
            assert "JOB_STATE_DIR" not in env


def test_ffdl_ranks_find_their_learner_from_host_numbers_from_0() -> None:
    own = " ".join(layout.mpi_setup().rank_prefix)
    ffdl = " ".join(layout.mpi_setup(FFDL_CONVENTIONS).rank_prefix)
    assert 'LEARNER_ID="${h##*-}"' in own and "JOB_STATE_DIR" not in own
    assert 'LEARNER_ID="$((${h##*-} + 1))"' in ffdl and "JOB_STATE_DIR=/job" in ffdl


def test_a_plan_named_one_way_is_refused_under_the_other() -> None:
    inputs = CASES["ffdl-parameter-server"].inputs()
    mixed = replace(inputs, plan=replace(inputs.plan, conventions=DLAAS_CONVENTIONS))
    with pytest.raises(ValueError, match="is not learner-abc123def456-1"):
        training_objects(mixed, CLUSTER)
