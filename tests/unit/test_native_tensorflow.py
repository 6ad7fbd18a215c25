"""Which frameworks leave native TensorFlow models (the only ones deployed for online
scoring) is the catalog's to say: Catalog.native_tensorflow, asked by check_deployable's
caller."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.domain.catalog import DEFAULT_CATALOG, Catalog
from service.domain.deployments import DEPLOYMENT_RULE, check_deployable
from service.errors import ValidationFailed
from service.platform import load_catalog

OPERATOR_FILE = """\
frameworks:
  tensorflow: {versions: ["2.21"], distribution: parameter_server}
  tensorflow-lite: {versions: ["2.21"], distribution: mpi, native_tensorflow: false}
  pytorch: {versions: ["2.3"], distribution: mpi}
  pytorch-onnx: {versions: ["2.3"], distribution: mpi, native_tensorflow: false}
  keras-jax: {versions: ["3.0"], distribution: mpi, native_tensorflow: true}
"""


@pytest.fixture
def operator(tmp_path: Path) -> Catalog:
    path = tmp_path / "catalog.yaml"
    path.write_text(OPERATOR_FILE)
    return load_catalog(path)


def test_the_default_tensorflow_frameworks_are_native_tensorflow() -> None:
    assert {n: f.native_tensorflow for n, f in DEFAULT_CATALOG.frameworks.items()} == {
        "tensorflow": True,
        "tensorflow-ddl": True,
        "tensorflow-horovod": True,
        "pytorch": False,
        "pytorch-ddl": False,
    }


@pytest.mark.parametrize(
    ("framework", "native"),
    [
        ("tensorflow", True),  # not set: judged by its name
        ("tensorflow-lite", False),  # set: the catalog says
        ("pytorch", False),  # not set: judged by its name
        ("pytorch-onnx", False),
        ("keras-jax", True),
        ("tensorflow-horovod", True),  # no longer in the catalog: judged by its name
        ("mxnet", False),
    ],
)
def test_an_operator_catalog_says_which_frameworks_are_native_tensorflow(
    operator: Catalog, framework: str, native: bool
) -> None:
    assert operator.native_tensorflow(framework) is native


@pytest.mark.parametrize(
    ("framework", "deployable"),
    [
        ("tensorflow", True),
        ("keras-jax", True),
        ("tensorflow-lite", False),
        ("pytorch", False),
        ("pytorch-onnx", False),
        ("mxnet", False),
    ],
)
def test_only_native_tensorflow_is_deployed(
    operator: Catalog, framework: str, deployable: bool
) -> None:
    def deploy() -> None:
        check_deployable(
            "t1",
            "COMPLETED",
            framework,
            True,
            native_tensorflow=operator.native_tensorflow(framework),
        )

    if deployable:
        deploy()
        return
    with pytest.raises(ValidationFailed) as info:
        deploy()
    problem = (
        f"training t1 used {framework}, not TensorFlow: its SavedModel is not served; "
        "export model/model.onnx instead"
    )
    assert [(e.field, e.message) for e in info.value.errors] == [("training_id", problem)]
    assert info.value.detail == f"{problem}; {DEPLOYMENT_RULE}"


def test_the_catalog_flag_survives_an_override_of_another_section() -> None:
    plan = {"distributed": False, "max_nodes": 1, "max_concurrent_trainings": 1}
    catalog = DEFAULT_CATALOG.with_overrides(
        {"plans": {"solo": {**plan, "predictions_per_minute": 10}}}
    )
    assert catalog.frameworks == DEFAULT_CATALOG.frameworks
