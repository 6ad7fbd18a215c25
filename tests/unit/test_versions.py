"""A deployment's versions and labels (service.domain.versions): which SavedModels a
training exports, which version a request gets, what a label may point at, what may be
unloaded. Table-tested, no server."""

from __future__ import annotations

import pytest

from service.domain import versions
from service.domain.deployments import ScoringTarget, VersionTarget
from service.domain.versions import VersionState
from service.errors import BadRequest, Conflict, UnknownVersion, ValidationFailed
from service.scoring.versions import resolve_version

R, D, F, U = (
    VersionState.READY,
    VersionState.DEPLOYING,
    VersionState.FAILED,
    VersionState.UNLOADED,
)


@pytest.mark.parametrize(
    ("keys", "found"),
    [
        ([], {}),
        (["model/saved_model.pb", "model/variables/v.index"], {1: "model/"}),
        # model/saved_model.pb stays version 1, whatever else is there
        (["1/saved_model.pb", "model/saved_model.pb", "2/saved_model.pb"], {1: "model/"}),
        (["1/saved_model.pb", "2/saved_model.pb", "2/variables/x"], {1: "1/", 2: "2/"}),
        (["7/saved_model.pb"], {7: "7/"}),
        (["model/3/saved_model.pb", "model/4/saved_model.pb"], {3: "model/3/", 4: "model/4/"}),
        # under model/ first where both are there
        (["1/saved_model.pb", "model/2/saved_model.pb"], {2: "model/2/"}),
        # not versions: no number, zero, nested deeper, not the graph, too large
        (["a/saved_model.pb", "0/saved_model.pb", "x/1/saved_model.pb"], {}),
        (["1/saved_model.pbtxt", "1/variables/saved_model.pb", "1/2/saved_model.pb"], {}),
        (["99999999999/saved_model.pb", "learner-1/logs/saved_model.pb"], {}),
    ],
)
def test_exported_versions(keys: list[str], found: dict[int, str]) -> None:
    assert versions.exported_versions(keys) == found


def test_latest_export_and_next_version() -> None:
    assert versions.latest_export({1: "1/", 3: "3/", 2: "2/"}) == "3/"
    assert versions.next_version([]) == 1
    assert versions.next_version([1, 2, 5]) == 6  # one above the highest ever held


@pytest.mark.parametrize(
    ("label", "valid"),
    [
        ("stable", True),
        ("canary", True),
        ("Blue-Green_2.0", True),
        ("a" * 64, True),
        ("a" * 65, False),
        ("", False),
        ("2", False),  # a number would read as a version
        ("-x", False),
        ("with space", False),
        ("slash/y", False),
    ],
)
def test_label_names(label: str, valid: bool) -> None:
    if valid:
        versions.check_label_name(label)
    else:
        with pytest.raises(ValidationFailed) as info:
            versions.check_label_name(label)
        assert info.value.errors[0].field == "/label"


@pytest.mark.parametrize(
    ("states", "labels", "version", "label", "expected"),
    [
        # neither: stable's where set and loaded, else the latest loaded
        ({1: R, 2: R}, {}, None, None, 2),
        ({1: R, 2: R}, {"stable": 1}, None, None, 1),
        ({1: R, 2: R}, {"canary": 1}, None, None, 2),
        ({1: R, 2: D}, {}, None, None, 1),  # a version still loading is not the default
        ({1: R, 2: F}, {}, None, None, 1),  # nor a failed one
        ({1: R, 2: U, 3: R}, {}, None, None, 3),
        ({1: U, 2: R}, {"stable": 1}, None, None, 2),  # stable at an unloaded version
        # a version
        ({1: R, 2: R}, {"stable": 1}, 2, None, 2),
        ({1: R, 2: R}, {}, 1, None, 1),
        # a label
        ({1: R, 2: R}, {"canary": 2, "stable": 1}, None, "canary", 2),
        ({1: R, 2: R}, {"canary": 2, "stable": 1}, None, "stable", 1),
        # unknown or not loaded
        ({1: R}, {}, 7, None, UnknownVersion),
        ({1: R, 2: D}, {}, 2, None, UnknownVersion),
        ({1: R, 2: F}, {}, 2, None, UnknownVersion),
        ({1: R, 2: U}, {}, 2, None, UnknownVersion),
        ({1: R}, {}, None, "canary", UnknownVersion),
        ({1: R, 2: U}, {"old": 2}, None, "old", UnknownVersion),
        ({1: F}, {}, None, None, UnknownVersion),
        ({}, {}, None, None, UnknownVersion),
        # both at once
        ({1: R}, {"stable": 1}, 1, "stable", BadRequest),
    ],
)
def test_resolve(
    states: dict[int, VersionState],
    labels: dict[str, int],
    version: int | None,
    label: str | None,
    expected: int | type[Exception],
) -> None:
    if isinstance(expected, int):
        assert versions.resolve("d1", states, labels, version, label) == expected
    else:
        with pytest.raises(expected) as info:
            versions.resolve("d1", states, labels, version, label)
        assert "d1" in str(info.value) or isinstance(info.value, BadRequest)


def test_unknown_version_is_a_404() -> None:
    with pytest.raises(UnknownVersion) as info:
        versions.resolve("d1", {1: R}, {}, 3, None)
    assert info.value.status == 404
    # In TensorFlow Serving's words (its clients show them), the field in the platform's.
    assert info.value.detail == "Servable not found for request: Specific(d1, 3)"
    assert info.value.errors[0].field == "version"
    assert info.value.errors[0].message == "deployment d1 has no version 3"


def test_resolve_version_reads_the_target() -> None:
    def version(n: int, state: VersionState) -> VersionTarget:
        return VersionTarget(n, state, f"deployments/d1/versions/{n}/", {})

    target = ScoringTarget(
        "d1",
        "deployments/d1/versions/2/",
        {},
        version=2,
        versions={1: version(1, R), 2: version(2, R), 3: version(3, F)},
        labels={"stable": 1, "canary": 2},
    )
    assert resolve_version(target, None, None) == 1
    assert resolve_version(target, None, "canary") == 2
    assert resolve_version(target, 2, None) == 2
    with pytest.raises(UnknownVersion):
        resolve_version(target, 3, None)
    assert target.at(1).model_key == "deployments/d1/versions/1/"
    assert target.at(1).version == 1 and target.at(2) is target
    # a target of one model without versions answers version 1 alone
    legacy = ScoringTarget("d2", "deployments/d2/model/", {})
    assert resolve_version(legacy, None, None) == 1
    assert resolve_version(legacy, 1, None) == 1
    with pytest.raises(UnknownVersion):
        resolve_version(legacy, 2, None)


@pytest.mark.parametrize(
    ("states", "version", "error", "field"),
    [
        ({1: R, 2: R}, 2, None, None),
        ({1: R}, 5, ValidationFailed, "/version"),  # no such version: 422
        ({1: R, 2: D}, 2, Conflict, "/version"),  # not loaded: 409
        ({1: R, 2: F}, 2, Conflict, "/version"),
        ({1: R, 2: U}, 2, Conflict, "/version"),
    ],
)
def test_a_label_points_at_a_loaded_version(
    states: dict[int, VersionState],
    version: int,
    error: type[Exception] | None,
    field: str | None,
) -> None:
    if error is None:
        versions.check_label_target("d1", states, version)
        return
    with pytest.raises(error) as info:
        versions.check_label_target("d1", states, version)
    assert isinstance(info.value, ValidationFailed | Conflict)
    assert info.value.errors[0].field == field


@pytest.mark.parametrize(
    ("states", "labels", "version", "outcome"),
    [
        ({1: R, 2: R}, {}, 1, True),
        ({1: R, 2: F}, {}, 2, True),  # a failed version may be cleared away
        ({1: R, 2: U}, {}, 2, False),  # already unloaded: nothing to do
        ({1: R, 2: R}, {"stable": 1}, 1, Conflict),  # a label points at it
        ({1: R, 2: R}, {"stable": 1, "x": 1}, 1, Conflict),
        ({1: R, 2: D}, {}, 2, Conflict),  # still loading
        ({1: R, 2: F}, {}, 1, Conflict),  # the only loaded one
        ({1: R}, {}, 9, UnknownVersion),
    ],
)
def test_unload(
    states: dict[int, VersionState],
    labels: dict[str, int],
    version: int,
    outcome: bool | type[Exception],
) -> None:
    if isinstance(outcome, bool):
        assert versions.check_unload("d1", states, labels, version) is outcome
        return
    with pytest.raises(outcome) as info:
        versions.check_unload("d1", states, labels, version)
    if labels:
        assert [e.field for e in info.value.errors] == [f"/labels/{n}" for n in sorted(labels)]


def test_versions_loaded_at_once_are_bounded() -> None:
    most = versions.MAX_LOADED_VERSIONS
    versions.check_addable("d1", {n: R for n in range(1, most)} | {most: U, most + 1: F})
    with pytest.raises(Conflict):
        versions.check_addable("d1", {n: R for n in range(1, most)} | {most: D})


@pytest.mark.parametrize(
    ("states", "messages", "outcome"),
    [
        ({1: D}, {}, None),
        ({1: R, 2: D}, {}, None),
        ({1: R}, {}, ("READY", None)),
        ({1: F, 2: R}, {1: "bad"}, ("READY", None)),
        ({1: F}, {1: "no serving_default"}, ("FAILED", "no serving_default")),
        ({1: F, 2: F}, {1: "a", 2: "b"}, ("FAILED", "version 1: a; version 2: b")),
        ({}, {}, ("FAILED", "the deployment holds no version to load")),
    ],
)
def test_deployment_outcome(
    states: dict[int, VersionState],
    messages: dict[int, str | None],
    outcome: tuple[str, str | None] | None,
) -> None:
    assert versions.deployment_outcome(states, messages) == outcome
