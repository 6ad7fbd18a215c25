"""The pod templates of Kubeflow jobs, as what a learner of the platform can carry (pure).

A replica's pod template says what runs (its one container's image, command, args, plain
environment variables, resources) and much that only a Kubernetes pod has (volumes, init
containers, placement, probes). What runs is read here; what a learner cannot carry is
refused naming the field (a JSON pointer into the file as sent), never dropped. A few
fields that only address Kubernetes' bookkeeping (labels, annotations, the pull policy)
change nothing a learner does and are accepted as they are (README: Coming from Kubeflow).

The image names a runtime of the platform: IMAGE_RULES (data), or the platform's own
learner images `dlaas/learner-<runtime>`. The platform runs its runtimes, not images.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.domain.catalog import Catalog
from service.domain.resources import parse_cpus, parse_memory
from service.errors import FieldError


def child(pointer: str, key: str | int) -> str:
    """`pointer` + one reference token, escaped as JSON pointers escape them (RFC 6901)."""
    return f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}"


class Refusals(list[FieldError]):
    """The fields of a job that cannot be carried, each with the reason."""

    def add(self, pointer: str, message: str) -> None:
        self.append(FieldError(pointer, message))


def mapping_at(value: object, pointer: str, refusals: Refusals) -> Mapping[str, Any]:
    """`value` if it is a mapping; else an empty one, refused."""
    if isinstance(value, Mapping):
        return value
    if value is not None:
        refusals.add(pointer, "must be a mapping")
    return {}


def check_keys(
    obj: Mapping[str, Any],
    pointer: str,
    refusals: Refusals,
    *,
    carried: Iterable[str],
    ignored: Iterable[str] = (),
    reasons: Mapping[str, str] | None = None,
) -> None:
    """Refuse every key of `obj` that is neither carried nor one that changes nothing a
    learner does (`ignored`), with its own reason where `reasons` has one."""
    known = set(carried) | set(ignored)
    for key in obj:
        if key not in known:
            why = (reasons or {}).get(key, "cannot be carried to the platform's learners")
            refusals.add(child(pointer, key), f"is not supported: {why}")


# Fields of a pod's spec that only a Kubernetes pod has, and why a learner has none.
_POD_REASONS = {
    "volumes": "learners have no volumes; the code comes from the code archive (MODEL_DIR) "
    "and data from the platform's data stores (DATA_DIR, RESULT_DIR)",
    "initContainers": "learners run one command; the platform's own steps fetch code and data",
    "nodeSelector": "learners are placed by their compute configuration, from resources.limits",
    "affinity": "learners are placed by their compute configuration, from resources.limits",
    "tolerations": "learners are placed by their compute configuration, from resources.limits",
    "nodeName": "learners are placed by their compute configuration, from resources.limits",
    "serviceAccountName": "learners hold no Kubernetes credentials",
    "hostNetwork": "every learner has a network of its own",
    "hostPID": "every learner has processes of its own",
    "hostIPC": "every learner has its own IPC namespace",
}
_CONTAINER_REASONS = {
    "volumeMounts": "learners have no volumes; the code comes from the code archive (MODEL_DIR) "
    "and data from the platform's data stores (DATA_DIR, RESULT_DIR)",
    "envFrom": "ConfigMaps and Secrets are not read; give the variables as env values",
    "workingDir": "the command runs in the code directory (MODEL_DIR)",
    "livenessProbe": "the platform follows each learner's command itself",
    "readinessProbe": "the platform follows each learner's command itself",
    "startupProbe": "the platform follows each learner's command itself",
    "lifecycle": "the platform starts and stops each learner's command itself",
}
# A security context may ask for a user; the sandbox runs every command as uid 1000
# without privileges whatever it asks, so these change nothing. Anything more is refused.
_USER_FIELDS = ("runAsUser", "runAsGroup", "runAsNonRoot")
_SANDBOX = "commands run in the platform's sandbox, as uid 1000 without privileges"
# What the platform sets in every learner: a job's env may not change them.
RESERVED_VARIABLES = frozenset(
    {
        "TRAINING_ID",
        "LEARNER_ID",
        "NUM_LEARNERS",
        "LEARNER_NAME_PREFIX",
        "GPU_COUNT",
        "MODEL_DIR",
        "DATA_DIR",
        "RESULT_DIR",
        "LOG_DIR",
        "CHECKPOINT_DIR",
        "TF_CONFIG",
        "PS_HOSTS_COUNT",
    }
)
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
GPU_RESOURCE = "nvidia.com/gpu"
LEARNER_PORT = 2222  # worker.launchers.plan.GRPC_PORT, where every learner listens


@dataclass
class Resources:
    """A learner's resources; each the largest a replica asks for."""

    gpus: int = 0
    cpus: float = 0.0
    memory_bytes: int = 0
    # Where the largest ask of each resource is written (its pointer), for refusals.
    where: dict[str, str] = field(default_factory=dict)

    def take(self, resource: str, amount: float, pointer: str) -> None:
        if amount > getattr(self, resource):
            setattr(self, resource, amount)
            self.where[resource] = pointer


@dataclass(frozen=True)
class Container:
    """What a replica's one container runs."""

    pointer: str  # .../template/spec/containers/0
    image: str
    # command + args; None when the container gives no command (the image's entrypoint).
    argv: tuple[str, ...] | None
    # Plain variables, in order, each with its pointer.
    env: tuple[tuple[str, str], ...]
    argv_pointers: tuple[str, ...]

    @property
    def command_at(self) -> str:
        return child(self.pointer, "command")


def shell_line(env: Iterable[tuple[str, str]], argv: Iterable[str]) -> str:
    """The platform's command (one /bin/sh -c line): the variables, then argv, each quoted
    so the shell sees exactly the words Kubernetes would have run."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in env]
    return " ".join([*assignments, shlex.join(argv)])


def read_container(
    replica: Mapping[str, Any], pointer: str, refusals: Refusals, resources: Resources
) -> Container | None:
    """The one container of a replica (at `pointer`), its resources taken into
    `resources`; None (refused) when the template cannot be carried."""
    check_keys(replica, pointer, refusals, carried=("replicas", "restartPolicy", "template"))
    template_at = child(pointer, "template")
    template = mapping_at(replica.get("template"), template_at, refusals)
    check_keys(template, template_at, refusals, carried=("spec",), ignored=("metadata",))
    spec_at = child(template_at, "spec")
    spec = mapping_at(template.get("spec"), spec_at, refusals)
    check_keys(
        spec,
        spec_at,
        refusals,
        carried=("containers", "securityContext"),
        ignored=("imagePullSecrets", "terminationGracePeriodSeconds", "restartPolicy"),
        reasons=_POD_REASONS,
    )
    _check_security_context(spec, spec_at, refusals, extra=("fsGroup", "supplementalGroups"))
    containers_at = child(spec_at, "containers")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        refusals.add(containers_at, "is required: one container")
        return None
    for extra in range(1, len(containers)):
        refusals.add(
            child(containers_at, extra),
            "is not supported: a learner runs one container (no sidecars)",
        )
    at = child(containers_at, 0)
    container = mapping_at(containers[0], at, refusals)
    check_keys(
        container,
        at,
        refusals,
        carried=(
            "name",
            "image",
            "command",
            "args",
            "env",
            "resources",
            "securityContext",
            "ports",
        ),
        ignored=("imagePullPolicy", "terminationMessagePath", "terminationMessagePolicy"),
        reasons=_CONTAINER_REASONS,
    )
    _check_security_context(container, at, refusals, extra=("allowPrivilegeEscalation",))
    _check_ports(container.get("ports"), child(at, "ports"), refusals)
    image = container.get("image")
    if not isinstance(image, str) or not image.strip():
        refusals.add(child(at, "image"), "is required: it names the runtime the job runs in")
        image = ""
    env = _read_env(container.get("env"), child(at, "env"), refusals)
    argv, argv_pointers = _read_argv(container, at, dict(env), refusals)
    _read_resources(container.get("resources"), child(at, "resources"), refusals, resources)
    return Container(at, image.strip(), argv, env, argv_pointers)


def _check_security_context(
    obj: Mapping[str, Any], pointer: str, refusals: Refusals, *, extra: tuple[str, ...]
) -> None:
    at = child(pointer, "securityContext")
    context = mapping_at(obj.get("securityContext"), at, refusals)
    check_keys(
        context,
        at,
        refusals,
        carried=(),
        ignored=(*_USER_FIELDS, *extra),
        reasons=dict.fromkeys(context, _SANDBOX),
    )
    if context.get("allowPrivilegeEscalation") is True:
        refusals.add(child(at, "allowPrivilegeEscalation"), f"is not supported: {_SANDBOX}")


def _check_ports(value: object, pointer: str, refusals: Refusals) -> None:
    """Ports are accepted where they say what the platform does: port 2222."""
    if value is None:
        return
    if not isinstance(value, list):
        refusals.add(pointer, "must be a list of ports")
        return
    for i, item in enumerate(value):
        at = child(pointer, i)
        port = mapping_at(item, at, refusals)
        check_keys(port, at, refusals, carried=("containerPort", "name", "protocol"))
        if port.get("containerPort") != LEARNER_PORT or port.get("protocol", "TCP") != "TCP":
            refusals.add(
                child(at, "containerPort"),
                f"is not supported: learners listen on TCP port {LEARNER_PORT} "
                "(TF_CONFIG names it)",
            )


def _read_env(value: object, pointer: str, refusals: Refusals) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        refusals.add(pointer, "must be a list of {name, value}")
        return ()
    env: list[tuple[str, str]] = []
    defined: dict[str, str] = {}
    for i, item in enumerate(value):
        at = child(pointer, i)
        entry = mapping_at(item, at, refusals)
        check_keys(
            entry,
            at,
            refusals,
            carried=("name", "value"),
            reasons={
                "valueFrom": "Secrets, ConfigMaps and the pod's fields are not read; "
                "give the value itself"
            },
        )
        name = entry.get("name")
        if (why := variable_refusal(name)) is not None:
            refusals.add(child(at, "name"), why)
            continue
        assert isinstance(name, str)  # variable_refusal accepts names only
        raw = entry.get("value", "")
        if not isinstance(raw, str):
            refusals.add(child(at, "value"), "must be a string")
            continue
        # Kubernetes expands $(NAME) of the variables defined before this one.
        text = expand(raw, defined)
        defined[name] = text
        env.append((name, text))
    return tuple(env)


def variable_refusal(name: object) -> str | None:
    """Why `name` cannot be a variable a job sets; None if it can."""
    if not isinstance(name, str) or not _VARIABLE.fullmatch(name):
        return "must be a variable name ([A-Za-z_][A-Za-z0-9_]*)"
    if name in RESERVED_VARIABLES:
        return f"{name} is set by the platform in every learner"
    return None


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' `$(NAME)` references in env values, command and args: the variable's
    value where the container defines it, as written where not; `$$` is a `$`."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return variables.get(name, match.group(0))

    return _REFERENCE.sub(one, text)


def _read_argv(
    container: Mapping[str, Any], pointer: str, env: Mapping[str, str], refusals: Refusals
) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    words: list[str] = []
    pointers: list[str] = []
    for key in ("command", "args"):
        value = container.get(key)
        at = child(pointer, key)
        if value is None:
            continue
        if not isinstance(value, list):
            refusals.add(at, "must be a list of strings")
            continue
        for i, word in enumerate(value):
            if isinstance(word, bool) or not isinstance(word, str | int | float):
                refusals.add(child(at, i), "must be a string")
                continue
            words.append(expand(str(word), env))
            pointers.append(child(at, i))
    if container.get("command") is None:
        return None, tuple(pointers)
    return tuple(words), tuple(pointers)


_KNOWN_RESOURCES = ("cpu", "memory", GPU_RESOURCE)


def _read_resources(value: object, pointer: str, refusals: Refusals, resources: Resources) -> None:
    spec = mapping_at(value, pointer, refusals)
    check_keys(spec, pointer, refusals, carried=("limits", "requests"))
    # A limit is what a container may use; where only a request is given it is the size.
    for part in ("requests", "limits"):
        at = child(pointer, part)
        amounts = mapping_at(spec.get(part), at, refusals)
        check_keys(
            amounts,
            at,
            refusals,
            carried=_KNOWN_RESOURCES,
            ignored=("ephemeral-storage",),
            reasons=dict.fromkeys(
                amounts,
                f"the platform's compute configurations offer cpu, memory and {GPU_RESOURCE}",
            ),
        )
        limits = mapping_at(spec.get("limits"), child(pointer, "limits"), Refusals())
        for name, amount in amounts.items():
            if part == "requests" and name in limits:
                continue
            _take(resources, name, amount, child(at, name), refusals)


def _take(
    resources: Resources, name: str, amount: object, pointer: str, refusals: Refusals
) -> None:
    try:
        if name == "cpu":
            resources.take("cpus", parse_cpus(_quantity(amount)), pointer)
        elif name == "memory":
            resources.take("memory_bytes", parse_memory(_quantity(amount)), pointer)
        elif name == GPU_RESOURCE:
            gpus = int(str(amount)) if not isinstance(amount, bool) else -1
            if gpus < 0:
                raise ValueError(f"{amount!r}: GPUs are a whole number")
            resources.take("gpus", gpus, pointer)
    except (ValueError, TypeError) as e:
        refusals.add(pointer, str(e) or "is not a quantity")


def _quantity(amount: object) -> str | int | float:
    if isinstance(amount, str | int | float):
        return amount
    raise ValueError(f"{amount!r} is not a quantity")


@dataclass(frozen=True)
class ImageRule:
    """Images that name one of the platform's runtimes: a regex matched at the start of
    the image reference (its registry host left out), and the framework and version of
    the catalog it means."""

    pattern: str
    framework: str
    version: str
    shown_as: str  # how a refusal lists it


# First match wins. TensorFlow 1.x images mean the "1.5" the platform serves with
# TensorFlow 2's compat.v1; Horovod's images (any image naming horovod) its Horovod runtime.
IMAGE_RULES: tuple[ImageRule, ...] = (
    ImageRule(r"tensorflow/tensorflow:1\.", "tensorflow", "1.5", "tensorflow/tensorflow:1.*"),
    ImageRule(
        r"tensorflow/tensorflow(:(2\.|latest|nightly)|@|$)",
        "tensorflow",
        "2.21",
        "tensorflow/tensorflow:2.*",
    ),
    ImageRule(
        r"horovod/horovod[a-z0-9-]*:[^@]*tf1\.",
        "tensorflow-horovod",
        "1.5",
        "horovod/horovod*:*tf1.*",
    ),
    ImageRule(
        r"[^:@]*horovod", "tensorflow-horovod", "2.21", "horovod/horovod*, any image naming horovod"
    ),
)
_LEARNER_IMAGE = re.compile(r"dlaas/learner-(?P<runtime>[a-z0-9][a-z0-9._-]*)(:|@|$)")


def _repository(image: str) -> str:
    """The image reference without its registry host (`docker.io/`, `ghcr.io/`...) and
    Docker Hub's `library/`."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        image = rest
    return image.removeprefix("library/")


def image_runtime(image: str, catalog: Catalog, distribution: str) -> tuple[str, str] | str:
    """The (framework, version) an image names for a job of `distribution`
    ("parameter_server": TFJob, "mpi": MPIJob), or why it names none."""
    repository = _repository(image)
    learner = _LEARNER_IMAGE.match(repository)
    if learner is not None:
        runtime = learner["runtime"]
        served = [
            (name, version)
            for name, version in catalog.runtimes_used().get(runtime, [])
            if catalog.frameworks[name].distribution == distribution
        ]
        if served:
            return served[-1]
    else:
        for rule in IMAGE_RULES:
            if re.match(rule.pattern, repository):
                spec = catalog.frameworks.get(rule.framework)
                if spec is not None and spec.distribution == distribution:
                    if rule.version in spec.versions:
                        return rule.framework, rule.version
                    return rule.framework, spec.versions[-1]
                break
    offered = ", ".join(offered_images(catalog, distribution))
    return (
        f"image '{image}' names no runtime of this platform for this job (the platform runs "
        f"its own runtimes, not images); offered: {offered}"
    )


def offered_images(catalog: Catalog, distribution: str) -> list[str]:
    """The images that name a runtime for a job of `distribution`, for refusals."""
    shown = [
        f"{rule.shown_as} ({rule.framework} {rule.version})"
        for rule in IMAGE_RULES
        if rule.framework in catalog.frameworks
        and catalog.frameworks[rule.framework].distribution == distribution
    ]
    for runtime, served in sorted(catalog.runtimes_used().items()):
        names = sorted({n for n, _ in served if catalog.frameworks[n].distribution == distribution})
        if names:
            shown.append(f"dlaas/learner-{runtime} ({', '.join(names)})")
    return shown
