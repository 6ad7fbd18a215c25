"""Every object-store key the platform writes or reads, built here and nowhere else.

The platform's store:
    trainings/<id>/model_definition.<zip|tar.gz>   the code archive as submitted
    trainings/<id>/results/...                     RESULT_DIR of the learners
    trainings/<id>/results/model/saved_model.pb    a SavedModel, deployable (version 1)
    trainings/<id>/results/model/model.onnx        an ONNX model, deployable (version 1)
    trainings/<id>/results/<n>/saved_model.pb      TensorFlow Serving's layout: version n
    trainings/<id>/results/learner-<i>/training-log.txt   learner i's output
    trainings/<id>/results/learner-<i>/logs/...    learner i's LOG_DIR
    trainings/<id>/metrics/learner-<i>/tensorboard.json   the scalars of learner i's
                                                   TensorBoard event files, as metric points
    trainings/<id>/metrics/learner-<i>/log.json    the points learner i's metric regexes
                                                   found in its output
    trainings/<id>/checkpoints/attempt-<n>/...     CHECKPOINT_DIR as attempt n left it
                                                   (learner-<i>/... for learners with one each)
    deployments/<id>/model/...                     the deployed copy of the SavedModel
                                                   (deployments made before versions)
    deployments/<id>/versions/<n>/...              the deployed copy of version n
A user's results bucket (the manifest's training_results_reference), WML's layout:
    training-<id>/...                              the same tree as trainings/<id>/results/
"""

from __future__ import annotations

from service.domain.deployments import ONNX_MODEL_FILE, SAVED_MODEL_DIR, SAVED_MODEL_FILE

LEARNER_LOG_NAME = "training-log.txt"


def training_prefix(training_id: str) -> str:
    """Everything the platform stores for a training (deleted with it)."""
    return f"trainings/{training_id}/"


def model_definition_key(training_id: str, archive_format: str) -> str:
    """The code archive; `archive_format` is `zip` or `tar.gz`."""
    return f"{training_prefix(training_id)}model_definition.{archive_format}"


def results_prefix(training_id: str) -> str:
    return f"{training_prefix(training_id)}results/"


def result_key(training_id: str, path: str) -> str:
    """A result file by its path below the results (checked by the caller)."""
    return results_prefix(training_id) + path


def saved_model_prefix(training_id: str) -> str:
    """Where a training's SavedModel is among its results."""
    return f"{results_prefix(training_id)}{SAVED_MODEL_DIR}/"


def saved_model_key(training_id: str) -> str:
    return f"{results_prefix(training_id)}{SAVED_MODEL_FILE}"


def onnx_model_key(training_id: str) -> str:
    """Where a training's ONNX model is among its results (beside a SavedModel's files)."""
    return f"{results_prefix(training_id)}{ONNX_MODEL_FILE}"


def metrics_prefix(training_id: str) -> str:
    """The metric points learners read from their event files: apart from the results,
    which hold RESULT_DIR, so no file of the user's can stand in for them."""
    return f"{training_prefix(training_id)}metrics/"


def tensorboard_metrics_key(training_id: str, learner_id: int) -> str:
    """Learner i's scalars from its TensorBoard event files (worker.learner.logdir)."""
    return f"{metrics_prefix(training_id)}learner-{learner_id}/tensorboard.json"


def log_metrics_key(training_id: str, learner_id: int) -> str:
    """Learner i's metric points from its output, found by the manifest's
    `evaluation_metrics` regexes as its log was written (worker.learner.logmetrics)."""
    return f"{metrics_prefix(training_id)}learner-{learner_id}/log.json"


def checkpoints_prefix(training_id: str) -> str:
    """Every saved CHECKPOINT_DIR of the training (only the latest attempt's is kept)."""
    return f"{training_prefix(training_id)}checkpoints/"


def attempt_checkpoints_prefix(training_id: str, attempt: int) -> str:
    """CHECKPOINT_DIR as `attempt` left it."""
    return f"{checkpoints_prefix(training_id)}attempt-{attempt}/"


def checkpoint_attempt(training_id: str, key: str) -> int | None:
    """The attempt whose saved CHECKPOINT_DIR `key` is in, or None if it is in none."""
    rest = key.removeprefix(checkpoints_prefix(training_id))
    if rest == key:
        return None
    head = rest.split("/", 1)[0]
    number = head.removeprefix("attempt-")
    return int(number) if number != head and number.isdigit() else None


def learner_checkpoints_prefix(attempt_prefix: str, learner_id: int) -> str:
    """Learner i's own CHECKPOINT_DIR within an attempt's (`attempt_checkpoints_prefix`):
    where learners that each have one (a pod each, on Kubernetes) save theirs. Learners
    that share one (the local backend) save it at the attempt's prefix itself."""
    return f"{attempt_prefix}learner-{learner_id}/"


def checkpoints_of_learner(attempt_prefix: str, relative_keys: list[str], learner_id: int) -> str:
    """Which part of a saved CHECKPOINT_DIR (its keys relative to `attempt_prefix`)
    learner i restores: its own part where the learners saved one each, the whole where
    they shared one (no top-level `learner-<n>/` folder)."""
    if any(_is_learner_folder(key.split("/", 1)[0]) for key in relative_keys if "/" in key):
        return learner_checkpoints_prefix(attempt_prefix, learner_id)
    return attempt_prefix


def _is_learner_folder(name: str) -> bool:
    number = name.removeprefix("learner-")
    return number != name and number.isdigit()


def learner_log_key(results: str, learner_id: int) -> str:
    """Learner i's output below a results prefix ending in `/` (or empty)."""
    return f"{results}learner-{learner_id}/{LEARNER_LOG_NAME}"


def learner_logs_prefix(results: str, learner_id: int) -> str:
    """Learner i's LOG_DIR below a results prefix ending in `/` (or empty)."""
    return f"{results}learner-{learner_id}/logs/"


def training_folder(training_id: str) -> str:
    """The folder of a training's results outside the platform's store: in the user's
    results bucket, and at the root of the results archive users download."""
    return f"training-{training_id}"


def user_results_prefix(training_id: str) -> str:
    """Where a training's results go in the user's results bucket."""
    return training_folder(training_id) + "/"


def deployment_prefix(deployment_id: str) -> str:
    """Everything the platform stores for a deployment (deleted with it)."""
    return f"deployments/{deployment_id}/"


def deployment_model_prefix(deployment_id: str) -> str:
    """Where a deployment made before it held versions keeps its one model (version 1)."""
    return f"{deployment_prefix(deployment_id)}{SAVED_MODEL_DIR}/"


def deployment_version_prefix(deployment_id: str, version: int) -> str:
    """The deployed copy of one version's SavedModel."""
    return f"{deployment_prefix(deployment_id)}versions/{version}/"
