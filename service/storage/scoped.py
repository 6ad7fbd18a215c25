"""Store credentials scoped to one training: temporary ones from STS AssumeRole with an
inline session policy, so a learner's pod can read its own model definition and saved
checkpoints and write its own results and checkpoints, and nothing else of the platform's
bucket (another training's code or results, deployments).

The session policy intersects with the role's own policy: what it allows is at most what
is listed here. `training_policy` is pure (tested as a table); `scoped_store` calls STS at
the store's own endpoint with the platform's credentials.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from service.domain.records import Secret
from service.storage.config import StoreConfig

# STS's bounds on DurationSeconds.
MIN_SESSION_SECONDS = 900
MAX_SESSION_SECONDS = 12 * 3600
# Beyond max_runtime: fetching before the command runs and storing after it ends.
SESSION_MARGIN_SECONDS = 1800

READ_ACTIONS = ("s3:GetObject",)
WRITE_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
LIST_ACTIONS = ("s3:ListBucket",)


@dataclass(frozen=True)
class TrainingScope:
    """What a training's learners may touch in the platform's bucket: `read_keys` exact
    keys and `read_prefixes` read only, `write_prefixes` read and written."""

    training_id: str
    read_keys: tuple[str, ...]
    read_prefixes: tuple[str, ...]
    write_prefixes: tuple[str, ...]


def training_policy(bucket: str, scope: TrainingScope) -> dict[str, Any]:
    """The IAM session policy for `scope` in `bucket`: GetObject on the read keys and
    prefixes, Get/Put/Delete (and aborting a multipart upload) below the write prefixes,
    ListBucket only for listings below one of the prefixes (the `s3:prefix` condition)."""
    bucket_arn = f"arn:aws:s3:::{bucket}"
    read = [f"{bucket_arn}/{key}" for key in scope.read_keys]
    read += [f"{bucket_arn}/{prefix}*" for prefix in scope.read_prefixes]
    write = [f"{bucket_arn}/{prefix}*" for prefix in scope.write_prefixes]
    listed = _unique(list(scope.read_prefixes) + list(scope.write_prefixes))
    statements: list[dict[str, Any]] = []
    if read:
        statements.append(_statement("Read", READ_ACTIONS, read))
    if write:
        statements.append(_statement("Write", WRITE_ACTIONS, write))
    if listed:
        statement = _statement("List", LIST_ACTIONS, [bucket_arn])
        statement["Condition"] = {"StringLike": {"s3:prefix": [f"{p}*" for p in listed]}}
        statements.append(statement)
    return {"Version": "2012-10-17", "Statement": statements}


def session_seconds(max_runtime: int, longest: int = MAX_SESSION_SECONDS) -> int:
    """How long the credentials must last: the training's max_runtime and a margin, within
    STS's bounds and at most `longest` (the role's MaxSessionDuration, as configured)."""
    longest = max(MIN_SESSION_SECONDS, min(longest, MAX_SESSION_SECONDS))
    return max(MIN_SESSION_SECONDS, min(max_runtime + SESSION_MARGIN_SECONDS, longest))


def session_name(training_id: str) -> str:
    """A RoleSessionName (2 to 64 of [\\w+=,.@-]) naming the training, for the audit log."""
    return ("dlaas-" + re.sub(r"[^\w+=,.@-]", "-", training_id))[:64]


def scoped_store(
    store: StoreConfig, role_arn: str, scope: TrainingScope, duration_seconds: int
) -> StoreConfig:
    """`store` (the platform's S3 store) with temporary credentials limited to `scope`,
    assumed from `role_arn` with the platform's credentials at the store's endpoint.
    Raises ValueError for a store that is not S3, botocore's errors for a refusal."""
    if store.kind != "s3" or not store.endpoint or not store.bucket:
        raise ValueError("only an S3 store's credentials can be scoped")
    import boto3  # only where credentials are scoped: the import is slow

    sts = boto3.client(
        "sts",
        endpoint_url=store.endpoint,
        region_name=store.region or "us-east-1",
        aws_access_key_id=Secret.reveal(store.access_key),
        aws_secret_access_key=Secret.reveal(store.secret_key),
        aws_session_token=Secret.reveal(store.session_token),
    )
    response = sts.assume_role(
        RoleArn=role_arn,
        RoleSessionName=session_name(scope.training_id),
        Policy=json.dumps(training_policy(store.bucket, scope), separators=(",", ":")),
        DurationSeconds=duration_seconds,
    )
    credentials = response["Credentials"]
    return dataclasses.replace(
        store,
        access_key=Secret(credentials["AccessKeyId"]),
        secret_key=Secret(credentials["SecretAccessKey"]),
        session_token=Secret(credentials["SessionToken"]),
    )


def _statement(sid: str, actions: Iterable[str], resources: list[str]) -> dict[str, Any]:
    return {"Sid": sid, "Effect": "Allow", "Action": list(actions), "Resource": resources}


def _unique(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))
