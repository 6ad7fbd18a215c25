"""FfDL's manifests, as FfDL's users wrote them, translated to the platform's own.

Pure. FfDL (the open core of IBM's DLaaS) describes a training by its resources (`gpus`,
`cpus`, `memory`, `learners`), its object store (`data_stores`) and a framework image
(`framework.name`, `.version`); the platform's manifest names a framework version of its
catalog and a compute configuration. `translate_ffdl` makes one into the other, field by
field, as the data below says, and refuses what cannot be carried naming the FfDL field
(a JSON pointer into the document as written) and the reason. The translated document is
then checked as any other (`service.domain.manifest.load_manifest`), its errors named in
FfDL's terms through `Translation.written_as`.

A translated manifest says `conventions: ffdl`: its learners run with FfDL's host names
(`<prefix>-<i>` from i = 0) and FfDL's variables (worker.launchers.plan).
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.domain.catalog import Catalog
from service.domain.resources import (
    NoComputeConfiguration,
    parse_cpus,
    parse_memory,
    smallest_compute,
)
from service.errors import FieldError, ValidationFailed

# Fields only FfDL's format has at its top level; a document with one of them and none of
# the platform's own (PLATFORM_KEYS) is an FfDL manifest.
FFDL_KEYS = frozenset(
    {"version", "gpus", "cpus", "memory", "learners", "data_stores", "gpu_type", "storage"}
)
PLATFORM_KEYS = frozenset(
    {
        "compute_configuration",
        "training_data_reference",
        "training_results_reference",
        "max_runtime",
        "retry_policy",
        "conventions",
        "COMPUTE_CONFIGURATION",
        "FRAMEWORK_NAME",
        "FRAMEWORK_VERSION",
        "EXECUTION_COMMAND",
    }
)

# FfDL's framework names -> the catalog's. A name not here that the catalog offers (an
# operator's `pytorch`, say) is taken as it is; any other is refused.
FRAMEWORKS = {"tensorflow": "tensorflow", "horovod": "tensorflow-horovod"}
# FfDL's frameworks with no runtime on this platform (unless the catalog offers one by
# that name, as the default catalog does `pytorch`): refused naming /framework/name.
NOT_OFFERED = ("caffe", "caffe2", "pytorch", "h2o3", "keras")

# FfDL's TensorFlow image tags: <major.minor.patch>[-gpu][-py3] (and "latest..."). Horovod's:
# <horovod>-tf<tensorflow>-torch<torch>-py<python>. Either names the TensorFlow line a
# script was written for; it runs on the catalog's version of the same major line, the
# newest offered (TensorFlow 1.x scripts on "1.5", the tf.compat.v1 line).
_TF_TAG = re.compile(r"(?P<tf>\d+\.\d+)(?:\.\d+)?(?P<suffix>(?:-gpu)?(?:-py[23](?:\.\d+)?)?)")
_HOROVOD_TAG = re.compile(r"\d+\.\d+(?:\.\d+)?-tf(?P<tf>\d+\.\d+)(?:\.\d+)?(?:-[A-Za-z0-9.]+)*")

# data_stores[].type: FfDL's object-store types become an S3 reference; the others cannot
# be carried.
S3_STORE_TYPES = ("mount_cos", "s3_datastore")
REFUSED_STORE_TYPES = {
    "mount_volume": "mounts a host or NFS volume into the learners, which cannot be carried: "
    "learners here read their data from an S3 bucket (use mount_cos or s3_datastore)",
    "swift_datastore": "Swift object stores are not supported: use an S3 endpoint "
    "(mount_cos or s3_datastore)",
}
# data_stores[].connection -> the platform's connection.
CONNECTION_FIELDS = {
    "auth_url": "endpoint_url",
    "user_name": "access_key_id",
    "password": "secret_access_key",
    "region": "region",
}
# Fields FfDL reads that say nothing the platform needs: accepted and not carried.
IGNORED = {
    "/version": "the version of FfDL's manifest format (FfDL does not read it either)",
    "/data_stores/0/id": "the data store's name within the manifest",
}
# `PS_HOSTS_COUNT=N` in front of the command (FfDL's tf-distributed example) sets how many
# learners serve parameters; FfDL's launcher defaults to 1.
_PS_HOSTS_COUNT = re.compile(r"^\s*PS_HOSTS_COUNT=['\"]?(?P<n>\d+)['\"]?\s")
DEFAULT_PARAMETER_SERVERS = 1


@dataclass
class Translation:
    """The platform's manifest document made of an FfDL manifest, and for each of its
    pointers the FfDL pointer it was made from (errors name the field the user wrote)."""

    document: dict[str, Any]
    written_as: dict[str, str] = field(default_factory=dict)
    # What the translation chose that the user did not write, in words (the compute
    # configuration, the framework version, the parameter servers).
    notes: list[str] = field(default_factory=list)


def is_ffdl_manifest(data: Mapping[str, Any]) -> bool:
    """Whether `data` is written in FfDL's format: one of FfDL's own top-level fields and
    none of the platform's."""
    keys = set(data)
    return bool(keys & FFDL_KEYS) and not keys & PLATFORM_KEYS


def translate_ffdl(data: Mapping[str, Any], catalog: Catalog) -> Translation:
    """The platform's manifest for an FfDL manifest, or ValidationFailed listing every FfDL
    field that cannot be carried, each with the reason."""
    out = Translation(document={"conventions": "ffdl"})
    errors = list(_translate(data, catalog, out))
    if errors:
        raise ValidationFailed(errors)
    return out


_TOP_LEVEL = (
    "name",
    "description",
    "version",
    "gpus",
    "cpus",
    "memory",
    "learners",
    "data_stores",
    "framework",
    "evaluation_metrics",
)


def _translate(data: Mapping[str, Any], catalog: Catalog, out: Translation) -> Iterator[FieldError]:
    doc = out.document
    for key in data:
        if key == "gpu_type":
            yield FieldError(
                "/gpu_type",
                "is not supported: the compute configuration (and so the GPU) is chosen "
                "from gpus, cpus and memory",
            )
        elif key == "storage":
            yield FieldError(
                "/storage",
                "is not supported: learners get the disk of their compute configuration",
            )
        elif key not in _TOP_LEVEL:
            yield FieldError(f"/{key}", "is not a field of FfDL's manifest format")
    for key in ("name", "description"):
        if key in data:
            doc[key] = data[key]
            out.written_as[f"/{key}"] = f"/{key}"
    if "version" in data and not isinstance(data["version"], str | int | float):
        yield FieldError("/version", 'must be a version string, e.g. "1.0"')
    nodes = yield from _learners(data)
    yield from _compute(data, catalog, nodes, out)
    yield from _data_stores(data.get("data_stores"), out)
    yield from _framework(data.get("framework"), catalog, nodes, out)
    yield from _metrics(data.get("evaluation_metrics", None), "evaluation_metrics" in data, out)


def _learners(data: Mapping[str, Any]) -> Generator[FieldError, None, int]:
    # A generator that returns the number of learners (1 when it cannot be read).
    learners = data.get("learners", 1)
    if isinstance(learners, bool) or not isinstance(learners, int) or learners < 1:
        yield FieldError(
            "/learners", f"must be a whole number of learners, at least 1; got {learners!r}"
        )
        return 1
    return learners


def _compute(
    data: Mapping[str, Any], catalog: Catalog, nodes: int, out: Translation
) -> Iterator[FieldError]:
    """gpus, cpus and memory (per learner) -> the smallest compute configuration that holds
    them; not given, a resource asks for nothing."""
    gpus = data.get("gpus", 0)
    ok = True
    if isinstance(gpus, float) and gpus.is_integer():
        gpus = int(gpus)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        yield FieldError("/gpus", f"must be a whole number of GPUs per learner; got {gpus!r}")
        ok = False
    try:
        cpus = parse_cpus(data.get("cpus", 0))
    except (TypeError, ValueError, AttributeError) as e:
        yield FieldError("/cpus", str(e))
        ok = False
    memory_bytes = 0
    if "memory" in data:
        memory = data["memory"]
        if isinstance(memory, int | float) and not isinstance(memory, bool):
            yield FieldError(
                "/memory",
                f"{memory!r} has no unit: FfDL's memory is written with one "
                "(MB, MiB, GB or GiB, e.g. 1Gb, 512MiB)",
            )
            ok = False
        else:
            try:
                memory_bytes = parse_memory(memory)
            except (TypeError, ValueError, AttributeError) as e:
                yield FieldError("/memory", str(e))
                ok = False
    if not ok:
        return
    try:
        name = smallest_compute(
            catalog, gpus=int(gpus), cpus=cpus, memory_bytes=memory_bytes, nodes=nodes
        )
    except NoComputeConfiguration as e:
        pointer = {"gpus": "/gpus", "cpus": "/cpus", "memory": "/memory", "nodes": "/learners"}
        yield FieldError(pointer[e.resources[0]], e.message)
        return
    out.document["compute_configuration"] = {"name": name, "nodes": nodes}
    out.written_as["/compute_configuration/nodes"] = "/learners"
    out.written_as["/compute_configuration/name"] = "/gpus"
    out.written_as["/compute_configuration"] = "/learners"
    out.notes.append(
        f"compute configuration {name}: the smallest that holds {int(gpus)} GPU(s), "
        f"{cpus:g} CPU(s) and {memory_bytes / 2**30:.3g} GiB per learner"
    )


def _data_stores(stores: Any, out: Translation) -> Iterator[FieldError]:
    """FfDL reads the first data store: its training_data and training_results containers
    become the data and results buckets, its connection the S3 connection of both."""
    if stores is None:
        return
    if not isinstance(stores, list):
        yield FieldError("/data_stores", "must be a list of data stores")
        return
    if len(stores) > 1:
        yield FieldError(
            "/data_stores/1",
            "FfDL uses only the first data store; give one (its training_data and "
            "training_results containers are the data and results buckets)",
        )
    if not stores:
        return
    store = stores[0]
    at = "/data_stores/0"
    if not isinstance(store, Mapping):
        yield FieldError(at, "must be a mapping (id, type, training_data, connection...)")
        return
    known = {"id", "type", "training_data", "training_results", "connection"}
    for key in store:
        if key not in known:
            yield FieldError(f"{at}/{key}", "is not a field of FfDL's data stores")
    kind = store.get("type")
    if kind in REFUSED_STORE_TYPES:
        yield FieldError(f"{at}/type", f"{kind} {REFUSED_STORE_TYPES[kind]}")
        return
    if kind not in S3_STORE_TYPES:
        yield FieldError(
            f"{at}/type", f"must be one of {', '.join(S3_STORE_TYPES)} (S3); got {kind!r}"
        )
        return
    connection = yield from _connection(store.get("connection"), f"{at}/connection")
    for section, reference, target in (
        ("training_data", "training_data_reference", "source"),
        ("training_results", "training_results_reference", "target"),
    ):
        if section not in store:
            continue
        part = store[section]
        if not isinstance(part, Mapping) or set(part) != {"container"}:
            yield FieldError(f"{at}/{section}", "must be {container: <bucket name>}")
            continue
        if connection is None:
            continue
        out.document[reference] = {
            "type": "s3",
            "connection": dict(connection),
            target: {"bucket": part["container"]},
        }
        out.written_as[f"/{reference}/{target}/bucket"] = f"{at}/{section}/container"
        out.written_as[f"/{reference}/{target}"] = f"{at}/{section}"
        for ffdl_name, name in CONNECTION_FIELDS.items():
            out.written_as[f"/{reference}/connection/{name}"] = f"{at}/connection/{ffdl_name}"
        out.written_as[f"/{reference}/connection"] = f"{at}/connection"
        out.written_as[f"/{reference}"] = at


def _connection(value: Any, at: str) -> Generator[FieldError, None, dict[str, Any] | None]:
    # A generator that returns the platform's connection (None when it cannot be made).
    if not isinstance(value, Mapping):
        yield FieldError(at, "must be a mapping: auth_url, user_name, password (and region)")
        return None
    connection: dict[str, Any] = {}
    bad = False
    for key, item in value.items():
        if key not in CONNECTION_FIELDS:
            yield FieldError(
                f"{at}/{key}",
                "is not an S3 connection field: auth_url, user_name (the access key), "
                "password (the secret key) and region are",
            )
            bad = True
        else:
            connection[CONNECTION_FIELDS[key]] = item
    for key in ("auth_url", "user_name", "password"):
        if key not in value:
            yield FieldError(f"{at}/{key}", "is required")
            bad = True
    return None if bad else connection


def framework_version(catalog: Catalog, framework: str, ffdl_version: str) -> str | None:
    """The catalog version of `framework` an FfDL image tag runs on: the one it names, or
    the newest offered of the same TensorFlow major line; None when none is."""
    spec = catalog.frameworks.get(framework)
    if spec is None:
        return None
    if ffdl_version in spec.versions:
        return ffdl_version
    match = _HOROVOD_TAG.fullmatch(ffdl_version) or _TF_TAG.fullmatch(ffdl_version)
    if match is None:
        return None
    tf = match["tf"]
    if tf in spec.versions:
        return tf
    major = tf.split(".")[0]
    same_line = [v for v in spec.versions if v.split(".")[0] == major]
    return max(same_line, key=_version_key) if same_line else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def _framework(value: Any, catalog: Catalog, nodes: int, out: Translation) -> Iterator[FieldError]:
    if not isinstance(value, Mapping):
        yield FieldError("/framework", "is required: name, version and command")
        return
    for key in value:
        if key not in ("name", "version", "command"):
            why = (
                "is not supported: trainings run in the platform's runtimes, not images"
                if key in ("image_tag", "image_location")
                else "is not a field of FfDL's framework section"
            )
            yield FieldError(f"/framework/{key}", why)
    name, version, command = value.get("name"), value.get("version"), value.get("command")
    if isinstance(version, int | float) and not isinstance(version, bool):
        version = str(version)
    for key, item in (("name", name), ("version", version), ("command", command)):
        if item is None:
            yield FieldError(f"/framework/{key}", "is required")
        elif not isinstance(item, str):
            yield FieldError(f"/framework/{key}", "must be a string")
    if not isinstance(name, str) or not isinstance(version, str) or not isinstance(command, str):
        return
    target = FRAMEWORKS.get(name, name if name in catalog.frameworks else None)
    if target is None or target not in catalog.frameworks:
        offered = ", ".join(
            [
                f"{ffdl} (as {ours})"
                for ffdl, ours in FRAMEWORKS.items()
                if ours in catalog.frameworks
            ]
            + [n for n in sorted(catalog.frameworks) if n not in FRAMEWORKS.values()]
        )
        why = "has no runtime on this platform" if name in NOT_OFFERED else "is not offered"
        yield FieldError("/framework/name", f"FfDL's framework '{name}' {why}; offered: {offered}")
        return
    ours = framework_version(catalog, target, version)
    if ours is None:
        offered_versions = ", ".join(catalog.frameworks[target].versions)
        yield FieldError(
            "/framework/version",
            f"{name} version '{version}' has no runtime here: the catalog offers {target} "
            f"{offered_versions} (FfDL's TensorFlow 1.x images run on 1.5)",
        )
        return
    framework: dict[str, Any] = {"name": target, "version": ours, "command": command}
    out.notes.append(
        f"framework {target} {ours} (runtime {catalog.runtime(target, ours)}) for FfDL's "
        f"{name} {version}"
    )
    if catalog.frameworks[target].distribution == "parameter_server" and nodes > 1:
        found = _PS_HOSTS_COUNT.match(command)
        ps = int(found["n"]) if found else DEFAULT_PARAMETER_SERVERS
        framework["parameter_servers"] = ps
        out.written_as["/framework/parameter_servers"] = (
            "/framework/command" if found else "/learners"
        )
        out.notes.append(
            f"learners 1..{ps} serve parameters (PS_HOSTS_COUNT={ps}"
            + (", from the command)" if found else ", FfDL's launcher's default)")
        )
    out.document["framework"] = framework
    for key in ("name", "version", "command"):
        out.written_as[f"/framework/{key}"] = f"/framework/{key}"


def _metrics(value: Any, given: bool, out: Translation) -> Iterator[FieldError]:
    """FfDL's `evaluation_metrics: {type: tensorboard, in: ...}` is the platform's own."""
    if not given:
        return
    if not isinstance(value, Mapping):
        yield FieldError("/evaluation_metrics", "must be a mapping: {type: tensorboard, in: ...}")
        return
    if value.get("type") != "tensorboard":
        yield FieldError(
            "/evaluation_metrics/type",
            f"only FfDL's tensorboard metrics are carried; got {value.get('type')!r} "
            "(or give the platform's list of regexes in its own manifest format)",
        )
        return
    metrics: dict[str, Any] = {"type": "tensorboard"}
    for key, item in value.items():
        if key == "in":
            metrics["in"] = item
        elif key == "event_types":
            if item not in (["scalars"], ("scalars",)):
                yield FieldError(
                    "/evaluation_metrics/event_types",
                    "only scalars are read from the event files: [scalars]",
                )
        elif key != "type":
            yield FieldError(
                f"/evaluation_metrics/{key}", "is not a field of FfDL's tensorboard metrics"
            )
    out.document["evaluation_metrics"] = metrics
    out.written_as["/evaluation_metrics"] = "/evaluation_metrics"
