"""Kubeflow TFJob and MPIJob files as manifests: each form translates (to what, exactly)
or is refused naming the field of the job (a JSON pointer into the file as sent)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.domain.catalog import DEFAULT_CATALOG
from service.domain.kubeflow_jobs import (
    SIGNAL_EXIT_CODES,
    is_kubernetes_object,
    translate_kubeflow_job,
)
from service.domain.manifest_formats import KUBEFLOW_FORMAT, load_submitted
from service.errors import ValidationFailed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubeflow"
TFJOB = yaml.safe_load((EXAMPLES / "tfjob-ps.yaml").read_text())
MPIJOB = yaml.safe_load((EXAMPLES / "mpijob-horovod.yaml").read_text())
PS = "/spec/tfReplicaSpecs/PS"
WORKER = "/spec/tfReplicaSpecs/Worker"
C0 = "template/spec/containers/0"
LAUNCHER = "/spec/mpiReplicaSpecs/Launcher"
MPI_WORKER = "/spec/mpiReplicaSpecs/Worker"
_DELETE = object()


def changed(base: dict[str, Any], *edits: tuple[str, Any]) -> dict[str, Any]:
    """`base` with each (path, value) set (a JSON pointer: "/a/b/0/c"), or removed."""
    doc = copy.deepcopy(base)
    for path, given in edits:
        value = copy.deepcopy(given) if given is not _DELETE else given
        *parents, last = (
            part.replace("~1", "/").replace("~0", "~") for part in path.strip("/").split("/")
        )
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        key: Any = int(last) if isinstance(node, list) else last
        if value is _DELETE:
            del node[key]
        elif isinstance(node, list) and key == len(node):
            node.append(value)
        else:
            node[key] = value
    return doc


def tf_both(path: str, value: Any) -> tuple[tuple[str, Any], tuple[str, Any]]:
    """The same edit to the PS and Worker replicas (one command, one image)."""
    return (f"{PS}/{path}", value), (f"{WORKER}/{path}", value)


def mpi_both(path: str, value: Any) -> tuple[tuple[str, Any], tuple[str, Any]]:
    return (f"{LAUNCHER}/{path}", value), (f"{MPI_WORKER}/{path}", value)


def single_worker(**container: Any) -> dict[str, Any]:
    """A TFJob of one Worker whose container is `container` over the example's."""
    doc = changed(TFJOB, (PS, _DELETE), (f"{WORKER}/replicas", 1))
    doc["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(container)
    return doc


def launcher_line(*words: str, workers: int = 2) -> dict[str, Any]:
    return changed(
        MPIJOB, (f"{LAUNCHER}/{C0}/command", list(words)), (f"{MPI_WORKER}/replicas", workers)
    )


def translated(doc: dict[str, Any]) -> dict[str, Any]:
    return translate_kubeflow_job(doc, DEFAULT_CATALOG).manifest


# -- what translates, and to what ---------------------------------------------------------


def test_the_ps_worker_tfjob_example_is_the_manifest_its_comment_shows() -> None:
    assert translated(TFJOB) == {
        "name": "ps-seed-tfjob",
        "framework": {
            "name": "tensorflow",
            "version": "2.21",
            "command": "python3 launcher.py --steps 100",
            "parameter_servers": 1,
        },
        "compute_configuration": {"name": "P100", "nodes": 3},
        "max_runtime": 1800,
        "retry_policy": {"max_retries": 1, "retry_on_lost": True},
    }


def test_the_horovod_mpijob_example_is_the_manifest_its_comment_shows() -> None:
    assert translated(MPIJOB) == {
        "name": "horovod-mnist",
        "framework": {
            "name": "tensorflow-horovod",
            "version": "2.21",
            "command": "NCCL_DEBUG=INFO python3 train_hvd.py --steps 30",
        },
        "compute_configuration": {"name": "P100", "nodes": 2},
    }


def test_only_kubernetes_objects_are_taken_for_jobs() -> None:
    assert is_kubernetes_object(TFJOB) and is_kubernetes_object({"kind": "TFJob"})
    assert not is_kubernetes_object({"name": "x", "framework": {}})


@dataclass(frozen=True)
class Translates:
    id: str
    job: dict[str, Any]
    expect: dict[str, Any]  # the manifest's fields (top-level keys) that must be these


TRANSLATES = [
    Translates(
        "workers-only-is-every-learner-a-worker",
        changed(TFJOB, (PS, _DELETE)),
        {
            "framework": {**translated(TFJOB)["framework"], "parameter_servers": 0},
            "compute_configuration": {"name": "P100", "nodes": 2},
        },
    ),
    Translates(
        "one-worker-is-a-single-learner",
        single_worker(resources={}),
        {"compute_configuration": {"name": "K80", "nodes": 1}},
    ),
    Translates(
        "a-chief-alone-is-a-single-learner",
        changed(
            TFJOB,
            (PS, _DELETE),
            ("/spec/tfReplicaSpecs/Chief", TFJOB["spec"]["tfReplicaSpecs"]["Worker"]),
            (WORKER, _DELETE),
            ("/spec/tfReplicaSpecs/Chief/replicas", 1),
        ),
        {"compute_configuration": {"name": "K80", "nodes": 1}},
    ),
    Translates(
        "tensorflow-1.x-image-is-version-1.5",
        changed(TFJOB, *tf_both(f"{C0}/image", "docker.io/tensorflow/tensorflow:1.15.5-gpu")),
        {"framework": {**translated(TFJOB)["framework"], "version": "1.5"}},
    ),
    Translates(
        "the-platforms-learner-image-names-its-runtime",
        changed(
            TFJOB, *tf_both(f"{C0}/image", "registry.example.com/dlaas/learner-platform:0.1.0")
        ),
        {"framework": {**translated(TFJOB)["framework"], "version": "2.21"}},
    ),
    Translates(
        "ddl-learner-image-is-tensorflow-ddl",
        changed(MPIJOB, *mpi_both(f"{C0}/image", "dlaas/learner-ddl-tf2.14:0.1.0")),
        {"framework": {**translated(MPIJOB)["framework"], "name": "tensorflow-ddl"}},
    ),
    Translates(
        "horovod-tf1-image-is-version-1.5",
        changed(
            MPIJOB, *mpi_both(f"{C0}/image", "horovod/horovod:0.19.0-tf1.15.0-torch1.4.0-py3.7")
        ),
        {"framework": {**translated(MPIJOB)["framework"], "version": "1.5"}},
    ),
    Translates(
        "an-image-naming-horovod-is-tensorflow-horovod",
        changed(MPIJOB, *mpi_both(f"{C0}/image", "example.org/team/tf-horovod-train:3")),
        {"framework": translated(MPIJOB)["framework"]},
    ),
    Translates(
        "command-and-args-are-shell-quoted-env-values-come-first",
        single_worker(
            command=["python3", "train.py"],
            args=["--note", "two words", "--dir=$(OUT)/x", "--id=$(LEARNER_ID)", "--cost=$$5"],
            env=[{"name": "OUT", "value": "/tmp/a b"}, {"name": "MODE", "value": "it's"}],
        ),
        {
            "framework": {
                "name": "tensorflow",
                "version": "2.21",
                "command": (
                    "OUT='/tmp/a b' MODE='it'\"'\"'s' python3 train.py --note 'two words' "
                    "'--dir=/tmp/a b/x' '--id=$(LEARNER_ID)' '--cost=$5'"
                ),
            }
        },
    ),
    Translates(
        "a-shell-command-stays-one-shell-command",
        single_worker(command=["/bin/sh", "-c", "python3 train.py && echo done"], args=None),
        {
            "framework": {
                "name": "tensorflow",
                "version": "2.21",
                "command": "/bin/sh -c 'python3 train.py && echo done'",
            }
        },
    ),
    Translates(
        "exit-code-restarts-retry-a-death-by-signal",
        changed(TFJOB, *tf_both("restartPolicy", "ExitCode"), ("/spec/runPolicy/backoffLimit", 2)),
        {
            "retry_policy": {
                "max_retries": 2,
                "retry_on_lost": True,
                "retry_on_exit_codes": list(SIGNAL_EXIT_CODES),
            }
        },
    ),
    Translates(
        "resources-from-requests-and-limits-the-largest-replica",
        changed(
            TFJOB,
            (f"{PS}/{C0}/resources", {"requests": {"memory": "30Gi", "cpu": "500m"}}),
            (f"{WORKER}/{C0}/resources", {"limits": {"cpu": 12}}),
        ),
        {"compute_configuration": {"name": "P100x2", "nodes": 3}},
    ),
    Translates(
        "generate-name-names-it",
        changed(TFJOB, ("/metadata/name", _DELETE), ("/metadata/generateName", "nightly-")),
        {"name": "nightly"},
    ),
    Translates(
        "mpirun-as-a-shell-line",
        launcher_line("/bin/bash", "-c", "mpirun --allow-run-as-root -np 2 python3 t.py --x 1"),
        {"framework": {**translated(MPIJOB)["framework"], "command": "python3 t.py --x 1"}},
    ),
    Translates(
        "mpirun-in-command-its-options-in-args",
        changed(
            MPIJOB,
            (f"{LAUNCHER}/{C0}/command", ["mpirun"]),
            (f"{LAUNCHER}/{C0}/args", ["-n", "2", "-x", "A=1 2", "python3", "t.py"]),
        ),
        {"framework": {**translated(MPIJOB)["framework"], "command": "A='1 2' python3 t.py"}},
    ),
    Translates(
        "horovodrun-line",
        launcher_line("horovodrun", "-np", "2", "-H", "w-0:1,w-1:1", "python", "train.py"),
        {"framework": {**translated(MPIJOB)["framework"], "command": "python train.py"}},
    ),
    Translates(
        "transport-options-are-the-platforms",
        launcher_line(
            "mpirun",
            "-np",
            "2",
            "--mca",
            "btl_tcp_if_include",
            "eth0",
            "--map-by",
            "slot:PE=1",
            "--hostfile",
            "/etc/mpi/hostfile",
            "python",
            "t.py",
        ),
        {"framework": {**translated(MPIJOB)["framework"], "command": "python t.py"}},
    ),
    Translates(
        "launcher-as-worker-hosts-ranks-too",
        changed(
            launcher_line("mpirun", "-np", "2", "python", "t.py", workers=1),
            ("/spec/runLauncherAsWorker", True),
        ),
        {"compute_configuration": {"name": "P100", "nodes": 2}},
    ),
    Translates(
        "two-slots-per-worker-on-two-gpus",
        changed(
            launcher_line("mpirun", "-np", "4", "python", "t.py"),
            ("/spec/slotsPerWorker", 2),
            (f"{MPI_WORKER}/{C0}/resources/limits/nvidia.com~1gpu", 2),
        ),
        {"compute_configuration": {"name": "P100x2", "nodes": 2}},
    ),
    Translates(
        "worker-runs-sshd-env-as-launcher",
        changed(
            MPIJOB,
            (f"{MPI_WORKER}/{C0}/command", ["/usr/sbin/sshd", "-De"]),
            (f"{LAUNCHER}/{C0}/env", [{"name": "A", "value": "1"}]),
            (f"{MPI_WORKER}/{C0}/env", [{"name": "A", "value": "1"}]),
        ),
        {
            "framework": {
                **translated(MPIJOB)["framework"],
                "command": "A=1 NCCL_DEBUG=INFO python3 train_hvd.py --steps 30",
            }
        },
    ),
    Translates(
        "bookkeeping-fields-change-nothing",
        changed(
            MPIJOB,
            ("/metadata/labels", {"team": "a"}),
            ("/spec/sshAuthMountPath", "/home/mpiuser/.ssh"),
            ("/spec/runPolicy/ttlSecondsAfterFinished", 60),
            (f"{LAUNCHER}/{C0}/securityContext", {"runAsUser": 1000}),
            (f"{LAUNCHER}/{C0}/imagePullPolicy", "Always"),
            (f"{LAUNCHER}/template/spec/imagePullSecrets", [{"name": "r"}]),
            ("/status", {"conditions": []}),
        ),
        {"framework": translated(MPIJOB)["framework"]},
    ),
]


@pytest.mark.parametrize("case", TRANSLATES, ids=lambda c: c.id)
def test_each_form_translates(case: Translates) -> None:
    manifest = translated(case.job)
    assert {k: manifest.get(k) for k in case.expect} == case.expect


# -- what is refused, naming the field ----------------------------------------------------


@dataclass(frozen=True)
class Refused:
    id: str
    job: dict[str, Any]
    field: str
    words: str


REFUSED = [
    Refused(
        "volumes",
        changed(TFJOB, (f"{WORKER}/template/spec/volumes", [{"name": "d", "emptyDir": {}}])),
        f"{WORKER}/template/spec/volumes",
        "learners have no volumes",
    ),
    Refused(
        "volume-mounts",
        changed(TFJOB, (f"{PS}/{C0}/volumeMounts", [{"name": "d", "mountPath": "/d"}])),
        f"{PS}/{C0}/volumeMounts",
        "learners have no volumes",
    ),
    Refused(
        "sidecar",
        changed(TFJOB, (f"{WORKER}/template/spec/containers/1", {"name": "s", "image": "x"})),
        f"{WORKER}/template/spec/containers/1",
        "no sidecars",
    ),
    Refused(
        "init-containers",
        changed(TFJOB, (f"{WORKER}/template/spec/initContainers", [{"name": "i"}])),
        f"{WORKER}/template/spec/initContainers",
        "run one command",
    ),
    Refused(
        "node-selector",
        changed(TFJOB, (f"{WORKER}/template/spec/nodeSelector", {"gpu": "v100"})),
        f"{WORKER}/template/spec/nodeSelector",
        "compute configuration",
    ),
    Refused(
        "tolerations",
        changed(TFJOB, (f"{WORKER}/template/spec/tolerations", [{"operator": "Exists"}])),
        f"{WORKER}/template/spec/tolerations",
        "compute configuration",
    ),
    Refused(
        "affinity",
        changed(TFJOB, (f"{WORKER}/template/spec/affinity", {"nodeAffinity": {}})),
        f"{WORKER}/template/spec/affinity",
        "compute configuration",
    ),
    Refused(
        "service-account",
        changed(TFJOB, (f"{WORKER}/template/spec/serviceAccountName", "trainer")),
        f"{WORKER}/template/spec/serviceAccountName",
        "no Kubernetes credentials",
    ),
    Refused(
        "host-network",
        changed(TFJOB, (f"{WORKER}/template/spec/hostNetwork", True)),
        f"{WORKER}/template/spec/hostNetwork",
        "a network of its own",
    ),
    Refused(
        "another-pod-field",
        changed(TFJOB, (f"{WORKER}/template/spec/priorityClassName", "high")),
        f"{WORKER}/template/spec/priorityClassName",
        "cannot be carried",
    ),
    Refused(
        "managed-by",
        changed(TFJOB, ("/spec/runPolicy/managedBy", "kueue.x-k8s.io/multikueue")),
        "/spec/runPolicy/managedBy",
        "runs the job itself",
    ),
    Refused(
        "a-different-image-per-replica",
        changed(TFJOB, (f"{WORKER}/{C0}/image", "tensorflow/tensorflow:2.16.1")),
        f"{WORKER}/{C0}/image",
        "every replica names one image",
    ),
    Refused(
        "foreign-image",
        changed(TFJOB, *tf_both(f"{C0}/image", "kubeflow/tf-dist-mnist-test:1.0")),
        f"{PS}/{C0}/image",
        "names no runtime of this platform",
    ),
    Refused(
        "horovod-image-in-a-tfjob",
        changed(TFJOB, *tf_both(f"{C0}/image", "horovod/horovod:0.28.1")),
        f"{PS}/{C0}/image",
        "tensorflow/tensorflow:2.* (tensorflow 2.21)",
    ),
    Refused(
        "tensorflow-image-in-an-mpijob",
        changed(MPIJOB, *mpi_both(f"{C0}/image", "tensorflow/tensorflow:2.15.0")),
        f"{LAUNCHER}/{C0}/image",
        "dlaas/learner-horovod-tf2.14 (tensorflow-horovod)",
    ),
    Refused(
        "env-from-a-secret",
        single_worker(env=[{"name": "K", "valueFrom": {"secretKeyRef": {"name": "s"}}}]),
        f"{WORKER}/{C0}/env/0/valueFrom",
        "give the value itself",
    ),
    Refused(
        "env-from",
        single_worker(envFrom=[{"configMapRef": {"name": "c"}}]),
        f"{WORKER}/{C0}/envFrom",
        "ConfigMaps and Secrets are not read",
    ),
    Refused(
        "env-the-platform-sets",
        single_worker(env=[{"name": "TF_CONFIG", "value": "{}"}]),
        f"{WORKER}/{C0}/env/0/name",
        "set by the platform",
    ),
    Refused(
        "working-dir",
        single_worker(workingDir="/var/tf"),
        f"{WORKER}/{C0}/workingDir",
        "code directory",
    ),
    Refused(
        "privileged",
        single_worker(securityContext={"privileged": True}),
        f"{WORKER}/{C0}/securityContext/privileged",
        "sandbox",
    ),
    Refused(
        "another-port",
        single_worker(ports=[{"containerPort": 8080}]),
        f"{WORKER}/{C0}/ports/0/containerPort",
        "port 2222",
    ),
    Refused(
        "probes",
        single_worker(livenessProbe={"exec": {"command": ["true"]}}),
        f"{WORKER}/{C0}/livenessProbe",
        "follows each learner's command",
    ),
    Refused(
        "the-images-entrypoint",
        single_worker(command=None, args=["--steps", "1"]),
        f"{WORKER}/{C0}/command",
        "not an image's entrypoint",
    ),
    Refused(
        "a-different-command-per-replica",
        changed(TFJOB, (f"{WORKER}/{C0}/args", ["--steps", "5"])),
        f"{WORKER}/{C0}/command",
        "every learner runs one command",
    ),
    Refused(
        "evaluator",
        changed(TFJOB, ("/spec/tfReplicaSpecs/Evaluator", TFJOB["spec"]["tfReplicaSpecs"]["PS"])),
        "/spec/tfReplicaSpecs/Evaluator",
        "parameter servers and workers",
    ),
    Refused(
        "chief-beside-workers",
        changed(TFJOB, ("/spec/tfReplicaSpecs/Chief", TFJOB["spec"]["tfReplicaSpecs"]["PS"])),
        "/spec/tfReplicaSpecs/Chief",
        "write the chief as one more Worker",
    ),
    Refused(
        "ps-without-workers",
        changed(TFJOB, (WORKER, _DELETE)),
        WORKER,
        "at least one worker",
    ),
    Refused(
        "unknown-replica-type",
        changed(TFJOB, ("/spec/tfReplicaSpecs/Foo", {"replicas": 1})),
        "/spec/tfReplicaSpecs/Foo",
        "is not supported",
    ),
    Refused(
        "restart-on-failure",
        changed(TFJOB, (f"{WORKER}/restartPolicy", "OnFailure")),
        f"{WORKER}/restartPolicy",
        "use Never or ExitCode",
    ),
    Refused(
        "scheduling-policy",
        changed(TFJOB, ("/spec/runPolicy/schedulingPolicy", {"queue": "q"})),
        "/spec/runPolicy/schedulingPolicy",
        "its own queue",
    ),
    Refused(
        "suspended",
        changed(TFJOB, ("/spec/runPolicy/suspend", True)),
        "/spec/runPolicy/suspend",
        "starts when it is admitted",
    ),
    Refused(
        "success-policy",
        changed(TFJOB, ("/spec/successPolicy", "ChiefOnly")),
        "/spec/successPolicy",
        "AllWorkers",
    ),
    Refused(
        "another-accelerator",
        changed(TFJOB, (f"{WORKER}/{C0}/resources/limits/amd.com~1gpu", 1)),
        f"{WORKER}/{C0}/resources/limits/amd.com~1gpu",
        "offer cpu, memory and nvidia.com/gpu",
    ),
    Refused(
        "more-gpus-than-any-configuration",
        changed(TFJOB, (f"{WORKER}/{C0}/resources/limits/nvidia.com~1gpu", 3)),
        f"{WORKER}/{C0}/resources/limits/nvidia.com~1gpu",
        "no compute configuration offers 3 GPU(s)",
    ),
    Refused(
        "memory-that-is-no-quantity",
        changed(TFJOB, (f"{WORKER}/{C0}/resources/limits/memory", "lots")),
        f"{WORKER}/{C0}/resources/limits/memory",
        "Kubernetes quantity",
    ),
    Refused(
        "mpijob-v1",
        changed(MPIJOB, ("/apiVersion", "kubeflow.org/v1")),
        "/apiVersion",
        "accepted: kubeflow.org/v1 TFJob, kubeflow.org/v2beta1 MPIJob",
    ),
    Refused(
        "pytorchjob",
        changed(TFJOB, ("/kind", "PyTorchJob")),
        "/kind",
        "not a job the platform takes",
    ),
    Refused(
        "no-name",
        changed(TFJOB, ("/metadata", {"namespace": "x"})),
        "/metadata/name",
        "is required",
    ),
    Refused(
        "launcher-not-mpirun",
        launcher_line("python3", "train.py"),
        f"{LAUNCHER}/{C0}/command/0",
        "must start with mpirun or horovodrun",
    ),
    Refused(
        "ranks-not-workers-times-slots",
        launcher_line("mpirun", "-np", "3", "python3", "t.py"),
        f"{LAUNCHER}/{C0}/command/2",
        "-np 3 is not this job's 2 worker(s) x 1 slot(s) = 2",
    ),
    Refused(
        "map-by-node",
        launcher_line("mpirun", "-np", "2", "-map-by", "node", "python3", "t.py"),
        f"{LAUNCHER}/{C0}/command/4",
        "maps ranks by slot",
    ),
    Refused(
        "an-mpirun-option-not-carried",
        launcher_line("mpirun", "--tag-output", "python3", "t.py"),
        f"{LAUNCHER}/{C0}/command/1",
        "'--tag-output' is not supported",
    ),
    Refused(
        "an-mca-parameter-not-carried",
        launcher_line("mpirun", "-mca", "plm_rsh_args", "-p 22", "python3", "t.py"),
        f"{LAUNCHER}/{C0}/command/2",
        "MCA parameter 'plm_rsh_args'",
    ),
    Refused(
        "a-shell-pipeline",
        launcher_line("sh", "-c", "mpirun -np 2 python t.py | tee out"),
        f"{LAUNCHER}/{C0}/command/2",
        "without other shell commands",
    ),
    Refused(
        "no-program",
        launcher_line("mpirun", "-np", "2"),
        f"{LAUNCHER}/{C0}/command/2",
        "names no program",
    ),
    Refused(
        "two-slots-on-one-gpu",
        changed(MPIJOB, ("/spec/slotsPerWorker", 2)),
        "/spec/slotsPerWorker",
        "one rank per GPU",
    ),
    Refused(
        "worker-runs-a-program",
        changed(MPIJOB, (f"{MPI_WORKER}/{C0}/command", ["python3", "serve.py"])),
        f"{MPI_WORKER}/{C0}/command",
        "sshd or none",
    ),
    Refused(
        "intel-mpi",
        changed(MPIJOB, ("/spec/mpiImplementation", "Intel")),
        "/spec/mpiImplementation",
        "Open MPI",
    ),
    Refused(
        "two-launchers",
        changed(MPIJOB, (f"{LAUNCHER}/replicas", 2)),
        f"{LAUNCHER}/replicas",
        "must be 1",
    ),
]


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.id)
def test_what_cannot_be_carried_is_refused_naming_the_field(case: Refused) -> None:
    with pytest.raises(ValidationFailed) as refused:
        translate_kubeflow_job(case.job, DEFAULT_CATALOG)
    fields = {e.field: e.message for e in refused.value.errors}
    assert case.field in fields, fields
    assert case.words in fields[case.field]


@pytest.mark.parametrize(
    ("job", "plan", "field", "words"),
    [
        (
            changed(TFJOB, ("/spec/runPolicy/backoffLimit", 9)),
            "standard",
            "/spec/runPolicy/backoffLimit",
            "at most 3 retries",
        ),
        (
            changed(TFJOB, ("/spec/runPolicy/activeDeadlineSeconds", 10**7)),
            "standard",
            "/spec/runPolicy/activeDeadlineSeconds",
            "at most 604800 s",
        ),
        (
            changed(TFJOB, (f"{WORKER}/replicas", 20)),
            "standard",
            f"{WORKER}/replicas",
            "at most 16 nodes",
        ),
        (
            changed(MPIJOB, ("/metadata/name", "x" * 200)),
            "standard",
            "/metadata/name",
            "at most 128 characters",
        ),
        (TFJOB, "lite", f"{WORKER}/replicas", "does not support distributed training"),
    ],
    ids=[
        "backoff-over-the-plan",
        "deadline-over-the-plan",
        "nodes-over-the-plan",
        "name-too-long",
        "distributed-on-lite",
    ],
)
def test_the_manifests_rules_name_the_jobs_fields(
    job: dict[str, Any], plan: str, field: str, words: str
) -> None:
    with pytest.raises(ValidationFailed) as refused:
        load_submitted(job, DEFAULT_CATALOG, plan)
    fields = {e.field: e.message for e in refused.value.errors}
    assert field in fields, fields
    assert words in fields[field]


def test_the_examples_load_as_valid_manifests_kept_as_sent() -> None:
    tf = load_submitted(TFJOB, DEFAULT_CATALOG, "standard")
    assert (tf.format, tf.document) == (KUBEFLOW_FORMAT, TFJOB)
    assert (tf.manifest.nodes, tf.manifest.parameter_servers_in(DEFAULT_CATALOG)) == (3, 1)
    assert tf.notes == (
        "image tensorflow/tensorflow:2.15.0 runs as tensorflow 2.21 (runtime platform)",
        "compute configuration P100: the smallest that holds 1 GPU(s), 2 CPU(s) and 4 GiB per "
        "learner (the largest replica's resources), on 3 node(s)",
    )
    mpi = load_submitted(MPIJOB, DEFAULT_CATALOG, "standard").manifest
    assert (mpi.framework.name, mpi.nodes) == ("tensorflow-horovod", 2)


@pytest.mark.parametrize(
    ("job", "replicas"),
    [(TFJOB, "tfReplicaSpecs"), (MPIJOB, "mpiReplicaSpecs")],
    ids=["tfjob", "mpijob"],
)
def test_the_examples_pod_templates_are_valid_kubernetes(
    job: dict[str, Any], replicas: str
) -> None:
    """The example files are what Kubeflow takes: each replica's template is a valid pod
    template for Kubernetes' own schema (the CRDs embed it)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for name, replica in job["spec"][replicas].items():
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": name.lower()},
            "template": replica["template"],
        }
        kubernetes_validate.validate(template, "1.30.0", strict=True)
