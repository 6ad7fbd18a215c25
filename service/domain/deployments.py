"""What can be deployed for online scoring, and the states of a deployment. Pure rules.

The seeds' rule: online deployment (scoring) is supported for native TensorFlow models
only. Here that means a COMPLETED training of a framework the catalog calls native
TensorFlow (`Catalog.native_tensorflow`) whose results hold a SavedModel
(`model/saved_model.pb`, or TensorFlow Serving's numbered `<n>/saved_model.pb`: see
service.domain.versions); the `serving_default` signature is checked when the model is
loaded, and a model without one fails to deploy with that reason. An ONNX model
(`model/model.onnx`, exported with `torch.onnx.export` or `tf2onnx`) is the one other form
served, from a COMPLETED training of any framework: it is run by ONNX Runtime, never
unpickled, and checked by service.domain.onnx_rules before it is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from service.domain.signature import SignatureInfo
from service.domain.states import TrainingState
from service.errors import Conflict, FieldError, ValidationFailed

# Where a training's SavedModel is expected, relative to its results.
SAVED_MODEL_DIR = "model"
SAVED_MODEL_FILE = f"{SAVED_MODEL_DIR}/saved_model.pb"
ONNX_MODEL_FILE = f"{SAVED_MODEL_DIR}/model.onnx"
# The file whose presence makes a model directory a model, each written last when a model
# is copied (so its presence means the copy is whole).
MODEL_MARKERS = ("saved_model.pb", "model.onnx")
SERVING_SIGNATURE = "serving_default"

EXPORT_GUIDE = "README.md#export-a-savedmodel-from-a-distributed-horovod--ddl-training"
ONNX_GUIDE = "README.md#deploy-an-onnx-model"
DEPLOYMENT_RULE = (
    "online deployment (scoring) takes a COMPLETED training whose results hold a "
    f"TensorFlow SavedModel ({SAVED_MODEL_FILE}, or TensorFlow Serving's numbered "
    f"<version>/saved_model.pb directories, with a '{SERVING_SIGNATURE}' signature, from a "
    f"native TensorFlow framework) or an ONNX model ({ONNX_MODEL_FILE}, see {ONNX_GUIDE}); "
    f"to export a SavedModel from a distributed (Horovod / DDL) training see {EXPORT_GUIDE}"
)


class DeploymentState(StrEnum):
    DEPLOYING = "DEPLOYING"
    READY = "READY"
    FAILED = "FAILED"


@dataclass(frozen=True)
class ScoringTarget:
    """What a prediction request needs to know of its READY deployment, detached from the
    database: the version it is for (`version`, whose model and signatures `model_key` and
    `signatures` are), and every version's state and the labels, from which a request's
    version is resolved (service.scoring.versions.resolve_version)."""

    id: str
    model_key: str
    signatures: dict[str, SignatureInfo]
    version: int = 1
    versions: Mapping[int, VersionTarget] = field(default_factory=dict)
    labels: Mapping[str, int] = field(default_factory=dict)

    def at(self, version: int) -> ScoringTarget:
        """This deployment's target for one of its versions."""
        if version == self.version:
            return self
        chosen = self.versions[version]
        return replace(
            self, version=version, model_key=chosen.model_key, signatures=chosen.signatures
        )


@dataclass(frozen=True)
class VersionTarget:
    """One version of a deployment as scoring sees it."""

    version: int
    state: str
    model_key: str
    signatures: dict[str, SignatureInfo]


def check_deployable(
    training_id: str,
    status: str,
    framework_name: str,
    has_saved_model: bool,
    *,
    native_tensorflow: bool,
    has_onnx_model: bool = False,
) -> None:
    """Raise Conflict (not COMPLETED) or ValidationFailed (neither a TensorFlow SavedModel
    of a native TensorFlow framework nor an ONNX model), both stating the rule; return when
    the training can be deployed. `native_tensorflow`: what the catalog says of the
    training's framework."""
    if status != TrainingState.COMPLETED:
        raise Conflict(
            f"training {training_id} is {status}, not COMPLETED; {DEPLOYMENT_RULE}",
            errors=[FieldError("training_id", f"training {training_id} is {status}")],
        )
    if has_onnx_model:
        return
    if not has_saved_model:
        # Said in the field's own message too: it is what a client shows (dlaas deploy).
        problem = (
            f"the results of training {training_id} hold no {SAVED_MODEL_FILE} "
            f"(nor <version>/saved_model.pb) and no {ONNX_MODEL_FILE}; a distributed "
            f"(Horovod / DDL) training exports one from rank 0: see {EXPORT_GUIDE}"
        )
    elif not native_tensorflow:
        problem = (
            f"training {training_id} used {framework_name}, not TensorFlow: its "
            f"SavedModel is not served; export {ONNX_MODEL_FILE} instead"
        )
    else:
        return
    raise ValidationFailed(
        [FieldError("training_id", problem)], detail=f"{problem}; {DEPLOYMENT_RULE}"
    )
