"""The session policy of a training's store credentials, as a table: which actions on which
ARNs, and the listings it allows; the session's duration and name."""

from __future__ import annotations

import json

import pytest

from service.storage import keys
from service.storage.config import StoreConfig
from service.storage.scoped import (
    MAX_SESSION_SECONDS,
    MIN_SESSION_SECONDS,
    SESSION_MARGIN_SECONDS,
    TrainingScope,
    scoped_store,
    session_name,
    session_seconds,
    training_policy,
)

TID = "training-Ab12"
BUCKET = "dlaas"
B = f"arn:aws:s3:::{BUCKET}"

SCOPE = TrainingScope(
    training_id=TID,
    read_keys=(keys.model_definition_key(TID, "zip"),),
    read_prefixes=(keys.attempt_checkpoints_prefix(TID, 1),),
    write_prefixes=(keys.results_prefix(TID), keys.attempt_checkpoints_prefix(TID, 2)),
)


def _grants(policy: dict[str, object]) -> set[tuple[str, str]]:
    """(action, resource) for every Allow in the policy."""
    out = set()
    for st in policy["Statement"]:  # type: ignore[attr-defined]
        assert st["Effect"] == "Allow"
        for action in st["Action"]:
            for resource in st["Resource"]:
                out.add((action, resource))
    return out


def test_the_policy_grants_exactly_the_training_s_keys() -> None:
    policy = training_policy(BUCKET, SCOPE)
    assert policy["Version"] == "2012-10-17"
    model = f"{B}/trainings/{TID}/model_definition.zip"
    restore = f"{B}/trainings/{TID}/checkpoints/attempt-1/*"
    results = f"{B}/trainings/{TID}/results/*"
    saves = f"{B}/trainings/{TID}/checkpoints/attempt-2/*"
    write = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
    assert _grants(policy) == {
        ("s3:GetObject", model),
        ("s3:GetObject", restore),
        *((a, results) for a in write),
        *((a, saves) for a in write),
        ("s3:ListBucket", B),
    }


@pytest.mark.parametrize(
    ("action", "resource", "allowed"),
    [
        ("s3:GetObject", f"{B}/trainings/{TID}/model_definition.zip", True),
        ("s3:PutObject", f"{B}/trainings/{TID}/model_definition.zip", False),
        ("s3:DeleteObject", f"{B}/trainings/{TID}/model_definition.zip", False),
        ("s3:PutObject", f"{B}/trainings/{TID}/checkpoints/attempt-1/*", False),
        ("s3:GetObject", f"{B}/trainings/other/model_definition.zip", False),
        ("s3:PutObject", f"{B}/trainings/other/results/*", False),
        ("s3:GetObject", f"{B}/deployments/*", False),
        ("s3:GetObject", f"{B}/*", False),
        ("s3:PutObject", f"{B}/trainings/{TID}/*", False),
        ("s3:ListBucket", f"{B}/*", False),
        ("s3:ListAllMyBuckets", "*", False),
        ("s3:DeleteBucket", B, False),
    ],
)
def test_what_the_policy_does_not_grant(action: str, resource: str, allowed: bool) -> None:
    assert ((action, resource) in _grants(training_policy(BUCKET, SCOPE))) is allowed


def test_listing_is_allowed_only_below_the_training_s_prefixes() -> None:
    [listing] = [s for s in training_policy(BUCKET, SCOPE)["Statement"] if s["Sid"] == "List"]
    assert listing["Resource"] == [B]
    assert listing["Condition"] == {
        "StringLike": {
            "s3:prefix": [
                f"trainings/{TID}/checkpoints/attempt-1/*",
                f"trainings/{TID}/results/*",
                f"trainings/{TID}/checkpoints/attempt-2/*",
            ]
        }
    }


def test_a_first_attempt_restores_nothing_and_lists_only_what_it_writes() -> None:
    scope = TrainingScope(TID, (keys.model_definition_key(TID, "tar.gz"),), (), ("r/",))
    statements = {s["Sid"]: s for s in training_policy(BUCKET, scope)["Statement"]}
    assert statements["Read"]["Resource"] == [f"{B}/trainings/{TID}/model_definition.tar.gz"]
    assert statements["List"]["Condition"]["StringLike"]["s3:prefix"] == ["r/*"]


def test_the_policy_fits_sts_s_packed_size_limit() -> None:
    long_id = "t" * 64
    scope = TrainingScope(
        long_id,
        (keys.model_definition_key(long_id, "tar.gz"),),
        (keys.attempt_checkpoints_prefix(long_id, 99),),
        (keys.results_prefix(long_id), keys.attempt_checkpoints_prefix(long_id, 100)),
    )
    packed = json.dumps(training_policy("b" * 63, scope), separators=(",", ":"))
    assert len(packed) < 2048


@pytest.mark.parametrize(
    ("max_runtime", "longest", "expected"),
    [
        (60, MAX_SESSION_SECONDS, 60 + SESSION_MARGIN_SECONDS),
        (0, MAX_SESSION_SECONDS, SESSION_MARGIN_SECONDS),
        (3600, MAX_SESSION_SECONDS, 3600 + SESSION_MARGIN_SECONDS),
        (7 * 24 * 3600, MAX_SESSION_SECONDS, MAX_SESSION_SECONDS),
        (7 * 24 * 3600, 3600, 3600),
        (3600, 10**6, 3600 + SESSION_MARGIN_SECONDS),
        (7 * 24 * 3600, 10, MIN_SESSION_SECONDS),
    ],
)
def test_the_session_lasts_max_runtime_and_a_margin_within_sts_bounds(
    max_runtime: int, longest: int, expected: int
) -> None:
    assert session_seconds(max_runtime, longest) == expected


def test_the_session_name_is_one_sts_accepts() -> None:
    assert session_name("abc-123") == "dlaas-abc-123"
    name = session_name("a b/c" + "x" * 100)
    assert name.startswith("dlaas-a-b-c") and len(name) == 64


def test_only_an_s3_store_s_credentials_are_scoped() -> None:
    with pytest.raises(ValueError, match="S3"):
        scoped_store(StoreConfig(kind="local", root="/x"), "arn:aws:iam::1:role/r", SCOPE, 900)
