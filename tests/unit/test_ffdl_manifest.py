"""FfDL's manifests translated to the platform's (service.domain.ffdl_manifest, read through
service.domain.manifest_formats), table-tested: every field and value form FfDL's manifest
documentation and examples use either translates (each row shows to what) or is refused
naming the FfDL field and the reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from service.domain.catalog import DEFAULT_CATALOG, FrameworkSpec
from service.domain.ffdl_manifest import IGNORED, framework_version, is_ffdl_manifest
from service.domain.manifest_formats import DLAAS_FORMAT, FFDL_FORMAT, load_submitted
from service.errors import ValidationFailed
from tests.manifest_cases import base, seed

CONNECTION = {"auth_url": "http://s3.example.com:9000", "user_name": "test", "password": "pw"}
S3 = {
    "endpoint_url": "http://s3.example.com:9000",
    "access_key_id": "test",
    "secret_access_key": "pw",
}


def ffdl(**overrides: Any) -> dict[str, Any]:
    """An FfDL manifest in the form of FfDL's examples (tf-model); a None override drops
    the field, a dict one is merged into it."""
    doc: dict[str, Any] = {
        "name": "tf_convolutional_network_tutorial",
        "description": "Convolutional network model using tensorflow",
        "version": "1.0",
        "gpus": 0,
        "cpus": 0.5,
        "memory": "1Gb",
        "learners": 1,
        "data_stores": [
            {
                "id": "sl-internal-os",
                "type": "mount_cos",
                "training_data": {"container": "tf_training_data"},
                "training_results": {"container": "tf_trained_model"},
                "connection": dict(CONNECTION),
            }
        ],
        "framework": {
            "name": "tensorflow",
            "version": "1.5.0-py3",
            "command": "python3 convolutional_network.py --data ${DATA_DIR}",
        },
    }
    for key, value in overrides.items():
        if value is None:
            doc.pop(key, None)
        elif isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return doc


def store(**overrides: Any) -> list[dict[str, Any]]:
    item = copy.deepcopy(ffdl()["data_stores"][0])
    for key, value in overrides.items():
        if value is None:
            item.pop(key, None)
        else:
            item[key] = value
    return [item]


def translated(doc: dict[str, Any], plan: str = "standard") -> dict[str, Any]:
    submitted = load_submitted(doc, DEFAULT_CATALOG, plan)
    assert submitted.format == FFDL_FORMAT
    return submitted.manifest.model_dump(mode="json", exclude_none=True, by_alias=True)


# (id, FfDL manifest, {pointer in the translated manifest: value}).
TRANSLATED: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "tf-model example",
        ffdl(evaluation_metrics={"type": "tensorboard", "in": "$JOB_STATE_DIR/logs/tb"}),
        {
            "/name": "tf_convolutional_network_tutorial",
            "/description": "Convolutional network model using tensorflow",
            "/conventions": "ffdl",
            "/framework": {
                "name": "tensorflow",
                "version": "1.5",
                "command": "python3 convolutional_network.py --data ${DATA_DIR}",
            },
            # gpus 0, cpus 0.5, 1Gb on one learner: the smallest configuration.
            "/compute_configuration": {"name": "K80", "nodes": 1},
            "/training_data_reference": {
                "type": "s3",
                "connection": S3,
                "source": {"bucket": "tf_training_data", "prefix": ""},
            },
            "/training_results_reference": {
                "type": "s3",
                "connection": S3,
                "target": {"bucket": "tf_trained_model"},
            },
            "/evaluation_metrics": {"type": "tensorboard", "in": "$JOB_STATE_DIR/logs/tb"},
        },
    ),
    (
        "tf-distributed example: PS_HOSTS_COUNT in the command",
        ffdl(
            learners=2,
            cpus=1,
            memory="1GiB",
            framework={"command": "PS_HOSTS_COUNT=1 ./launcher.py python3 mnist_dist.py"},
        ),
        {
            "/compute_configuration": {"name": "P100", "nodes": 2},
            "/framework/parameter_servers": 1,
        },
    ),
    (
        "PS_HOSTS_COUNT=2 on 3 learners",
        ffdl(learners=3, framework={"command": "PS_HOSTS_COUNT=2 ./launcher.py python3 m.py"}),
        {"/framework/parameter_servers": 2, "/compute_configuration/nodes": 3},
    ),
    (
        "no PS_HOSTS_COUNT: FfDL's launcher's default, 1",
        ffdl(learners=2),
        {"/framework/parameter_servers": 1},
    ),
    ("one learner: no parameter servers", ffdl(), {"/framework/parameter_servers": None}),
    ("learners not given: 1", ffdl(learners=None), {"/compute_configuration/nodes": 1}),
    (
        "version 1.5.0-gpu-py3",
        ffdl(framework={"version": "1.5.0-gpu-py3"}),
        {"/framework/version": "1.5"},
    ),
    (
        "version 1.5.0 (python 2 image)",
        ffdl(framework={"version": "1.5.0"}),
        {"/framework/version": "1.5"},
    ),
    ("version 1.5.1-py3", ffdl(framework={"version": "1.5.1-py3"}), {"/framework/version": "1.5"}),
    (
        "version 1.3.0-py3: the 1.x line",
        ffdl(framework={"version": "1.3.0-py3"}),
        {"/framework/version": "1.5"},
    ),
    ("version 1.8.0-gpu", ffdl(framework={"version": "1.8.0-gpu"}), {"/framework/version": "1.5"}),
    (
        "version 1.5 (the catalog's)",
        ffdl(framework={"version": "1.5"}),
        {"/framework/version": "1.5"},
    ),
    (
        "version 1.5 as a YAML number",
        ffdl(framework={"version": 1.5}),
        {"/framework/version": "1.5"},
    ),
    (
        "version 2.21.0-py3",
        ffdl(framework={"version": "2.21.0-py3"}),
        {"/framework/version": "2.21"},
    ),
    (
        "horovod 0.13.10-tf1.9.0-torch0.4.0-py3.5 on its runtime's 1.5",
        ffdl(
            learners=2, framework={"name": "horovod", "version": "0.13.10-tf1.9.0-torch0.4.0-py3.5"}
        ),
        {
            "/framework/name": "tensorflow-horovod",
            "/framework/version": "1.5",
            "/framework/parameter_servers": None,
            "/compute_configuration": {"name": "P100", "nodes": 2},
        },
    ),
    (
        "horovod 0.13.4-tf1.8.0-torch0.4.0-py2.7",
        ffdl(
            learners=2, framework={"name": "horovod", "version": "0.13.4-tf1.8.0-torch0.4.0-py2.7"}
        ),
        {"/framework/name": "tensorflow-horovod", "/framework/version": "1.5"},
    ),
    ("gpus 1", ffdl(gpus=1), {"/compute_configuration/name": "K80"}),
    ("gpus 2", ffdl(gpus=2), {"/compute_configuration/name": "K80x2"}),
    (
        "gpus 2 on 2 learners: distributed",
        ffdl(gpus=2, learners=2),
        {"/compute_configuration/name": "P100x2"},
    ),
    ("cpus 8", ffdl(cpus=8), {"/compute_configuration/name": "P100"}),
    ("cpus not given", ffdl(cpus=None), {"/compute_configuration/name": "K80"}),
    ("memory 1GB", ffdl(memory="1GB"), {"/compute_configuration/name": "K80"}),
    ("memory 512MiB", ffdl(memory="512MiB"), {"/compute_configuration/name": "K80"}),
    ("memory 512MB", ffdl(memory="512MB"), {"/compute_configuration/name": "K80"}),
    ("memory 30GiB", ffdl(memory="30GiB"), {"/compute_configuration/name": "K80x2"}),
    ("memory not given", ffdl(memory=None), {"/compute_configuration/name": "K80"}),
    (
        "s3_datastore with a region",
        ffdl(data_stores=store(type="s3_datastore", connection={**CONNECTION, "region": "eu"})),
        {"/training_data_reference/connection/region": "eu"},
    ),
    (
        "no training_results: results in the platform's store",
        ffdl(data_stores=store(training_results=None)),
        {
            "/training_results_reference": None,
            "/training_data_reference/source/bucket": "tf_training_data",
        },
    ),
    ("no data_stores", ffdl(data_stores=None), {"/training_data_reference": None}),
    ("version is not carried", ffdl(version="2.0"), {"/version": None}),
    (
        "tensorboard without in",
        ffdl(evaluation_metrics={"type": "tensorboard"}),
        {"/evaluation_metrics": {"type": "tensorboard"}},
    ),
    (
        "tensorboard with event_types [scalars]",
        ffdl(evaluation_metrics={"type": "tensorboard", "event_types": ["scalars"]}),
        {"/evaluation_metrics/type": "tensorboard"},
    ),
    ("no evaluation_metrics", ffdl(), {"/evaluation_metrics": []}),
]

_MISSING = object()


def _at(doc: Any, pointer: str) -> Any:
    for part in pointer.strip("/").split("/"):
        if not isinstance(doc, dict) or part not in doc:
            return _MISSING
        doc = doc[part]
    return doc


@pytest.mark.parametrize(
    ("doc", "expected"), [t[1:] for t in TRANSLATED], ids=[t[0] for t in TRANSLATED]
)
def test_ffdl_fields_translate(doc: dict[str, Any], expected: dict[str, Any]) -> None:
    out = translated(doc)
    for pointer, value in expected.items():
        found = _at(out, pointer)
        if value is None:
            assert found is _MISSING, f"{pointer}: {found!r}"
        else:
            assert found == value, f"{pointer}: {found!r} != {value!r}"


# (id, FfDL manifest, plan, the FfDL field the refusal names, words of its message).
REFUSED: list[tuple[str, dict[str, Any], str, str, str]] = [
    (
        "caffe",
        ffdl(framework={"name": "caffe", "version": "cpu"}),
        "standard",
        "/framework/name",
        "'caffe' has no runtime",
    ),
    (
        "caffe2",
        ffdl(framework={"name": "caffe2", "version": "latest"}),
        "standard",
        "/framework/name",
        "offered: tensorflow (as tensorflow), horovod (as tensorflow-horovod)",
    ),
    (
        # The catalog offers pytorch 2.13: FfDL's name is taken as it is, its image tag
        # names no version the catalog has.
        "pytorch",
        ffdl(framework={"name": "pytorch", "version": "latest"}),
        "standard",
        "/framework/version",
        "pytorch version 'latest' has no runtime here: the catalog offers pytorch 2.13",
    ),
    (
        "h2o3",
        ffdl(framework={"name": "h2o3", "version": "latest"}),
        "standard",
        "/framework/name",
        "'h2o3' has no runtime",
    ),
    (
        "an unknown framework",
        ffdl(framework={"name": "mxnet"}),
        "standard",
        "/framework/name",
        "'mxnet' is not offered",
    ),
    (
        "tensorflow latest",
        ffdl(framework={"version": "latest-py3"}),
        "standard",
        "/framework/version",
        "offers tensorflow 1.5, 2.21",
    ),
    (
        "tensorflow 3.0",
        ffdl(framework={"version": "3.0.0"}),
        "standard",
        "/framework/version",
        "has no runtime here",
    ),
    (
        "horovod without a tf version",
        ffdl(learners=2, framework={"name": "horovod", "version": "0.13.4"}),
        "standard",
        "/framework/version",
        "tensorflow-horovod",
    ),
    (
        "an image tag",
        ffdl(framework={"image_tag": "x"}),
        "standard",
        "/framework/image_tag",
        "not images",
    ),
    (
        "an image location",
        ffdl(framework={"image_location": {"registry": "r"}}),
        "standard",
        "/framework/image_location",
        "runtimes",
    ),
    (
        "no command",
        ffdl(framework={"name": "tensorflow", "version": "1.5.0-py3"} | {"command": None}),
        "standard",
        "/framework/command",
        "is required",
    ),
    ("no framework", ffdl(framework=None), "standard", "/framework", "is required"),
    (
        "gpu_type",
        ffdl(gpu_type="nvidia-TeslaK80"),
        "standard",
        "/gpu_type",
        "chosen from gpus, cpus and memory",
    ),
    ("storage", ffdl(storage="10Gb"), "standard", "/storage", "not supported"),
    (
        "an unknown field",
        ffdl(learner_count=2),
        "standard",
        "/learner_count",
        "not a field of FfDL's manifest",
    ),
    ("memory without a unit", ffdl(memory=100), "standard", "/memory", "has no unit"),
    (
        "memory not a size",
        ffdl(memory="lots"),
        "standard",
        "/memory",
        "memory is a number of bytes with a unit",
    ),
    (
        "FfDL's default memory, 60Gb",
        ffdl(memory="60Gb"),
        "standard",
        "/memory",
        "no compute configuration offers",
    ),
    ("cpus 64", ffdl(cpus=64), "standard", "/cpus", "no compute configuration offers 64 CPU(s)"),
    ("cpus not a number", ffdl(cpus="many"), "standard", "/cpus", "cpus is a number of CPUs"),
    ("gpus 4", ffdl(gpus=4), "standard", "/gpus", "no compute configuration offers 4 GPU(s)"),
    ("gpus negative", ffdl(gpus=-1), "standard", "/gpus", "whole number of GPUs"),
    ("gpus fractional", ffdl(gpus=0.5), "standard", "/gpus", "whole number of GPUs"),
    ("learners 0", ffdl(learners=0), "standard", "/learners", "at least 1"),
    (
        "learners on the lite plan",
        ffdl(learners=2),
        "lite",
        "/learners",
        "does not support distributed training",
    ),
    ("learners above the plan", ffdl(learners=17), "standard", "/learners", "at most 16 nodes"),
    (
        "mount_volume",
        ffdl(data_stores=store(type="mount_volume")),
        "standard",
        "/data_stores/0/type",
        "mount_volume mounts a host or NFS volume",
    ),
    (
        "swift_datastore",
        ffdl(data_stores=store(type="swift_datastore")),
        "standard",
        "/data_stores/0/type",
        "Swift",
    ),
    (
        "an unknown store type",
        ffdl(data_stores=store(type="hdfs")),
        "standard",
        "/data_stores/0/type",
        "mount_cos, s3_datastore",
    ),
    (
        "two data stores",
        ffdl(data_stores=store() * 2),
        "standard",
        "/data_stores/1",
        "only the first data store",
    ),
    (
        "data_stores not a list",
        ffdl(data_stores={"id": "x"}),
        "standard",
        "/data_stores",
        "must be a list",
    ),
    (
        "no password",
        ffdl(
            data_stores=store(connection={k: v for k, v in CONNECTION.items() if k != "password"})
        ),
        "standard",
        "/data_stores/0/connection/password",
        "is required",
    ),
    (
        "no auth_url",
        ffdl(data_stores=store(connection={"user_name": "u", "password": "p"})),
        "standard",
        "/data_stores/0/connection/auth_url",
        "is required",
    ),
    (
        "a Swift connection field",
        ffdl(data_stores=store(connection={**CONNECTION, "domain_name": "d"})),
        "standard",
        "/data_stores/0/connection/domain_name",
        "not an S3 connection field",
    ),
    (
        "training_workspace",
        ffdl(data_stores=store(training_workspace={"container": "w"})),
        "standard",
        "/data_stores/0/training_workspace",
        "not a field of FfDL's data stores",
    ),
    (
        "a container without its name",
        ffdl(data_stores=store(training_data={"bucket": "b"})),
        "standard",
        "/data_stores/0/training_data",
        "{container: <bucket name>}",
    ),
    (
        "optivist metrics",
        ffdl(evaluation_metrics={"type": "optivist", "in": "$JOB_STATE_DIR/logs"}),
        "standard",
        "/evaluation_metrics/type",
        "only FfDL's tensorboard metrics",
    ),
    (
        "tensorboard images",
        ffdl(evaluation_metrics={"type": "tensorboard", "event_types": ["images"]}),
        "standard",
        "/evaluation_metrics/event_types",
        "only scalars",
    ),
    (
        "metrics groups",
        ffdl(evaluation_metrics={"type": "tensorboard", "groups": {}}),
        "standard",
        "/evaluation_metrics/groups",
        "not a field",
    ),
    ("a name too long", ffdl(name="x" * 200), "standard", "/name", "at most 128"),
    # The translated manifest's rules, named as FfDL wrote them.
    (
        "PS_HOSTS_COUNT not below learners",
        ffdl(learners=2, framework={"command": "PS_HOSTS_COUNT=2 ./l.py"}),
        "standard",
        "/framework/command",
        "must be less than nodes",
    ),
]


@pytest.mark.parametrize(
    ("doc", "plan", "field", "words"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_ffdl_fields_refused_naming_the_field(
    doc: dict[str, Any], plan: str, field: str, words: str
) -> None:
    with pytest.raises(ValidationFailed) as info:
        load_submitted(doc, DEFAULT_CATALOG, plan)
    named = {e.field: e.message for e in info.value.errors}
    assert field in named, named
    assert words in named[field], named[field]


def test_every_refusal_is_listed_at_once() -> None:
    doc = ffdl(
        memory=100,
        gpu_type="k80",
        framework={"name": "caffe"},
        data_stores=store(type="mount_volume"),
    )
    with pytest.raises(ValidationFailed) as info:
        load_submitted(doc, DEFAULT_CATALOG, "standard")
    assert {e.field for e in info.value.errors} == {
        "/memory",
        "/gpu_type",
        "/framework/name",
        "/data_stores/0/type",
    }


def test_a_framework_the_catalog_offers_by_its_ffdl_name_is_taken() -> None:
    catalog = DEFAULT_CATALOG.model_copy(
        update={
            "frameworks": {
                **DEFAULT_CATALOG.frameworks,
                "pytorch": FrameworkSpec(versions=("2.3",), distribution="parameter_server"),
            }
        }
    )
    doc = ffdl(framework={"name": "pytorch", "version": "2.3"})
    manifest = load_submitted(doc, catalog, "standard").manifest
    assert (manifest.framework.name, manifest.framework.version) == ("pytorch", "2.3")


def test_the_choices_are_said() -> None:
    submitted = load_submitted(
        ffdl(learners=2, framework={"command": "PS_HOSTS_COUNT=1 ./launcher.py"}),
        DEFAULT_CATALOG,
        "standard",
    )
    assert submitted.notes == (
        "compute configuration P100: the smallest that holds 0 GPU(s), 0.5 CPU(s) and "
        "0.931 GiB per learner",
        "framework tensorflow 1.5 (runtime platform) for FfDL's tensorflow 1.5.0-py3",
        "learners 1..1 serve parameters (PS_HOSTS_COUNT=1, from the command)",
    )
    assert submitted.document["memory"] == "1Gb"  # as sent


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (ffdl(), True),
        ({"name": "x", "learners": 2, "framework": {}}, True),
        ({"name": "x", "data_stores": []}, True),
        (base(), False),
        (seed(), False),
        # Both formats' fields: the platform's, whose errors name FfDL's as unknown.
        (base(learners=2), False),
        ({"name": "x", "framework": {"name": "tensorflow"}}, False),
    ],
)
def test_the_format_is_recognised(doc: dict[str, Any], expected: bool) -> None:
    assert is_ffdl_manifest(doc) is expected


def test_the_platforms_own_format_is_read_as_before() -> None:
    submitted = load_submitted(seed(), DEFAULT_CATALOG, "standard")
    assert submitted.format == DLAAS_FORMAT
    assert submitted.manifest.conventions is None
    assert submitted.as_written([]) == []
    assert submitted.written_as["/compute_configuration"] == "/COMPUTE_CONFIGURATION"


@pytest.mark.parametrize(
    ("framework", "ffdl_version", "expected"),
    [
        ("tensorflow", "1.5.0-py3", "1.5"),
        ("tensorflow", "1.5.0-gpu-py3", "1.5"),
        ("tensorflow", "1.7.0-gpu-py3", "1.5"),
        ("tensorflow", "2.21", "2.21"),
        ("tensorflow", "2.3.0-py3", "2.21"),
        ("tensorflow", "latest", None),
        ("tensorflow-horovod", "0.13.10-tf1.9.0-torch0.4.0-py3.5", "1.5"),
        ("tensorflow-horovod", "0.16.0-tf2.0.0-torch1.2.0-py3.6", "2.21"),
        ("caffe", "cpu", None),
    ],
)
def test_framework_versions(framework: str, ffdl_version: str, expected: str | None) -> None:
    assert framework_version(DEFAULT_CATALOG, framework, ffdl_version) == expected


def test_the_fields_not_carried_are_named() -> None:
    assert set(IGNORED) == {"/version", "/data_stores/0/id"}
