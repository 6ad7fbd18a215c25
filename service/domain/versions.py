"""A deployment's versions and labels. Pure rules: which SavedModels a training's results
export (and under which version numbers), which version a request gets, what a label may
point at, what may be unloaded.

A deployment holds numbered versions, each a SavedModel of some training served by a
model process of its own. A request names a version, or a label (`stable`, `canary`, any
name) that points at one, or neither: then it gets the version the `stable` label points
at where that label is set, else the latest loaded version, as TensorFlow Serving's
default version policy serves the latest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import StrEnum

from service.domain.deployments import SAVED_MODEL_DIR
from service.errors import BadRequest, Conflict, FieldError, UnknownVersion, ValidationFailed

STABLE = "stable"
CANARY = "canary"
# A label: a letter, then letters, digits, '.', '_' or '-'; not a number, so that a path
# or parameter that takes either cannot mistake one for a version.
LABEL_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")
LABEL_RULE = "a label is 1 to 64 characters: a letter, then letters, digits, '.', '_' or '-'"
# How many versions of one deployment may be loaded at once (each is a model process).
MAX_LOADED_VERSIONS = 8
# The largest version number (TensorFlow Serving's are int64; the database's int32).
MAX_VERSION = 2**31 - 1

_GRAPH = "saved_model.pb"
_NUMBERED = re.compile(r"(?:(?P<model>" + re.escape(SAVED_MODEL_DIR) + r")/)?(?P<n>[0-9]{1,10})/")


class VersionState(StrEnum):
    DEPLOYING = "DEPLOYING"  # being copied and loaded
    READY = "READY"  # loaded: answers requests
    FAILED = "FAILED"  # its model could not be loaded (the reason is kept)
    UNLOADED = "UNLOADED"  # was unloaded: its model process is stopped

    @property
    def loaded(self) -> bool:
        return self is VersionState.READY


def exported_versions(relative_keys: Iterable[str]) -> dict[int, str]:
    """Version number -> the directory (relative to the results, ending in '/') of each
    SavedModel a training's results export, from the results' keys relative to the
    results. `model/saved_model.pb` is version 1 alone, as it always was; without it,
    TensorFlow Serving's layout: numbered directories `<n>/saved_model.pb` (or
    `model/<n>/saved_model.pb`), each version n (n >= 1), the ones under `model/` first
    where both are there. Empty when the results export no SavedModel."""
    top: dict[int, str] = {}
    under_model: dict[int, str] = {}
    for key in relative_keys:
        if key == f"{SAVED_MODEL_DIR}/{_GRAPH}":
            return {1: f"{SAVED_MODEL_DIR}/"}
        if not key.endswith(f"/{_GRAPH}"):
            continue
        directory = key[: -len(_GRAPH)]
        match = _NUMBERED.fullmatch(directory)
        if match is None:
            continue
        number = int(match.group("n"))
        if not 1 <= number <= MAX_VERSION:
            continue
        (under_model if match.group("model") else top)[number] = directory
    return dict(sorted((under_model or top).items()))


def latest_export(exports: Mapping[int, str]) -> str:
    """The directory of the SavedModel a training adds as a deployment's next version:
    its highest version."""
    return exports[max(exports)]


def next_version(existing: Iterable[int]) -> int:
    """The number of a deployment's next version: one above the highest it ever held."""
    return max(existing, default=0) + 1


def check_label_name(label: str) -> None:
    if not LABEL_PATTERN.fullmatch(label):
        raise ValidationFailed(
            [FieldError("/label", f"'{label}' is not a label name: {LABEL_RULE}")]
        )


def default_version(states: Mapping[int, VersionState], labels: Mapping[str, int]) -> int | None:
    """The version a request that names none gets: `stable`'s where it points at a loaded
    version, else the latest loaded one; None when no version is loaded."""
    stable = labels.get(STABLE)
    if stable is not None and states.get(stable) is VersionState.READY:
        return stable
    loaded = [n for n, state in states.items() if state.loaded]
    return max(loaded) if loaded else None


def resolve(
    deployment_id: str,
    states: Mapping[int, VersionState],
    labels: Mapping[str, int],
    version: int | None,
    label: str | None,
) -> int:
    """The loaded version a request for (`version`, `label`) gets; UnknownVersion for a
    version or label that is not there or not loaded, BadRequest for both at once."""
    if version is not None and label is not None:
        message = "name a version or a label, not both"
        raise BadRequest(message, errors=[FieldError("version", message)])
    if version is not None:
        state = states.get(version)
        if state is None:
            # TensorFlow Serving's words: its clients show them as they are.
            raise UnknownVersion(
                f"Servable not found for request: Specific({deployment_id}, {version})",
                errors=[
                    FieldError("version", f"deployment {deployment_id} has no version {version}")
                ],
            )
        if not state.loaded:
            raise UnknownVersion(
                f"Servable not found for request: Specific({deployment_id}, {version})",
                errors=[FieldError("version", f"version {version} is {state}, not loaded")],
            )
        return version
    if label is not None:
        target = labels.get(label)
        if target is None:
            raise UnknownVersion(
                f"Servable not found for request: Labeled({deployment_id}, {label}) "
                f"(unrecognized servable version label '{label}')",
                errors=[FieldError("label", f"deployment {deployment_id} has no label '{label}'")],
            )
        state = states.get(target)
        if state is None or not state.loaded:
            raise UnknownVersion(
                f"Servable not found for request: Labeled({deployment_id}, {label}) (it "
                f"points at version {target}, which is not loaded)",
                errors=[FieldError("label", f"version {target} is not loaded")],
            )
        return target
    chosen = default_version(states, labels)
    if chosen is None:
        raise UnknownVersion(f"deployment {deployment_id} has no loaded version")
    return chosen


def check_label_target(
    deployment_id: str, states: Mapping[int, VersionState], version: int
) -> None:
    """A label may point only at a loaded version: ValidationFailed (422) for a version the
    deployment does not hold, Conflict (409) for one that is not loaded."""
    state = states.get(version)
    if state is None:
        raise ValidationFailed(
            [FieldError("/version", f"deployment {deployment_id} has no version {version}")]
        )
    if not state.loaded:
        message = f"version {version} is {state}; a label points only at a loaded version"
        raise Conflict(
            f"version {version} of deployment {deployment_id} is {state}; a label points "
            "only at a loaded (READY) version",
            errors=[FieldError("/version", message)],
        )


def check_addable(deployment_id: str, states: Mapping[int, VersionState]) -> None:
    """Conflict while the deployment loads as many versions as it may at once."""
    loading = [n for n, s in states.items() if s in (VersionState.READY, VersionState.DEPLOYING)]
    if len(loading) >= MAX_LOADED_VERSIONS:
        message = (
            f"deployment {deployment_id} has {len(loading)} versions loaded or loading, the "
            f"most it may; unload one first"
        )
        raise Conflict(message, errors=[FieldError("/training_id", message)])


def check_unload(
    deployment_id: str,
    states: Mapping[int, VersionState],
    labels: Mapping[str, int],
    version: int,
) -> bool:
    """Whether unloading `version` changes anything (False: it is unloaded already).
    UnknownVersion for a version the deployment never held; Conflict while a label points
    at it, while it is still loading, or when it is the last loaded version (delete the
    deployment instead)."""
    state = states.get(version)
    if state is None:
        raise UnknownVersion(
            f"deployment {deployment_id} has no version {version}",
            errors=[FieldError("version", f"no version {version}")],
        )
    if state is VersionState.UNLOADED:
        return False
    pointing = sorted(name for name, target in labels.items() if target == version)
    if pointing:
        names = ", ".join(f"'{n}'" for n in pointing)
        raise Conflict(
            f"version {version} of deployment {deployment_id} is what the labels {names} "
            "point at; move or delete them first",
            errors=[FieldError(f"/labels/{n}", f"points at version {version}") for n in pointing],
        )
    if state is VersionState.DEPLOYING:
        raise Conflict(
            f"version {version} of deployment {deployment_id} is still DEPLOYING; unload it "
            "once it is READY or FAILED",
            errors=[FieldError("version", f"version {version} is DEPLOYING")],
        )
    others = [n for n, s in states.items() if s.loaded and n != version]
    if state.loaded and not others:
        raise Conflict(
            f"version {version} is the only loaded version of deployment {deployment_id}; "
            "delete the deployment instead",
            errors=[FieldError("version", f"version {version} is the only one loaded")],
        )
    return True


def deployment_outcome(
    states: Mapping[int, VersionState], messages: Mapping[int, str | None]
) -> tuple[str, str | None] | None:
    """How a DEPLOYING deployment's first versions ended: ("READY", None) when any loaded,
    ("FAILED", the reasons) when none did (or it holds none), None while any is still
    loading."""
    if not states:
        return "FAILED", "the deployment holds no version to load"
    if any(s is VersionState.DEPLOYING for s in states.values()):
        return None
    if any(s.loaded for s in states.values()):
        return "READY", None
    reasons = [messages.get(n) or f"version {n} failed" for n in sorted(states)]
    if len(reasons) == 1:
        return "FAILED", reasons[0]
    return "FAILED", "; ".join(
        f"version {n}: {r}" for n, r in zip(sorted(states), reasons, strict=True)
    )
