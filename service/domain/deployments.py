"""What can be deployed for online scoring, and the states of a deployment. Pure rules.

The seeds' rule: online deployment (scoring) is supported for native TensorFlow models
only. Here that means a COMPLETED training of a framework the catalog calls native
TensorFlow (`Catalog.native_tensorflow`) whose results hold a SavedModel
(`model/saved_model.pb`); the `serving_default` signature is checked when the model is
loaded, and a model without one fails to deploy with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from service.domain.signature import SignatureInfo
from service.domain.states import TrainingState
from service.errors import Conflict, FieldError, ValidationFailed

# Where a training's SavedModel is expected, relative to its results.
SAVED_MODEL_DIR = "model"
SAVED_MODEL_FILE = f"{SAVED_MODEL_DIR}/saved_model.pb"
SERVING_SIGNATURE = "serving_default"

EXPORT_GUIDE = "README.md#export-a-savedmodel-from-a-distributed-horovod--ddl-training"
DEPLOYMENT_RULE = (
    "online deployment (scoring) is supported for native TensorFlow models only: a "
    f"COMPLETED training whose results hold a TensorFlow SavedModel ({SAVED_MODEL_FILE} "
    f"with a '{SERVING_SIGNATURE}' signature); to export one from a distributed "
    f"(Horovod / DDL) training see {EXPORT_GUIDE}"
)


class DeploymentState(StrEnum):
    DEPLOYING = "DEPLOYING"
    READY = "READY"
    FAILED = "FAILED"


@dataclass(frozen=True)
class ScoringTarget:
    """What a prediction request needs to know of its READY deployment, detached from the
    database."""

    id: str
    model_key: str
    signatures: dict[str, SignatureInfo]


def check_deployable(
    training_id: str,
    status: str,
    framework_name: str,
    has_saved_model: bool,
    *,
    native_tensorflow: bool,
) -> None:
    """Raise Conflict (not COMPLETED) or ValidationFailed (not a TensorFlow SavedModel),
    both stating the rule; return when the training can be deployed. `native_tensorflow`:
    what the catalog says of the training's framework."""
    if status != TrainingState.COMPLETED:
        raise Conflict(
            f"training {training_id} is {status}, not COMPLETED; {DEPLOYMENT_RULE}",
            errors=[FieldError("training_id", f"training {training_id} is {status}")],
        )
    if not native_tensorflow:
        problem = f"training {training_id} used {framework_name}, not TensorFlow"
    elif not has_saved_model:
        # Said in the field's own message too: it is what a client shows (dlaas deploy).
        problem = (
            f"the results of training {training_id} hold no {SAVED_MODEL_FILE}; a "
            f"distributed (Horovod / DDL) training exports one from rank 0: see {EXPORT_GUIDE}"
        )
    else:
        return
    raise ValidationFailed(
        [FieldError("training_id", problem)], detail=f"{problem}; {DEPLOYMENT_RULE}"
    )
