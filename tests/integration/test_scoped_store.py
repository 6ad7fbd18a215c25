"""A training's scoped store credentials against moto's server: STS AssumeRole at the
store's endpoint, then the platform's store opened (service.storage.open_store, as a
learner's steps open it) with the temporary key, secret and session token.

What moto checks, and what it does not: moto's IAM-like access control
(INITIAL_NO_AUTH_ACTION_COUNT) evaluates the policies attached to the assumed ROLE, but
ignores the inline session Policy given to AssumeRole, and it does not evaluate the
`s3:prefix` condition of ListBucket. So `test_the_policy_enforced_by_moto` gives the role
itself the training's policy document: it shows that the document, as moto's evaluator
reads it, lets the learner read its model definition and write its results and refuses
another training's keys and writes outside its prefixes (AccessDenied). That a real STS
applies the same document as a session policy is AWS's (and MinIO's) documented
behaviour, not something these tests can show."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from minio import Minio
from minio.error import S3Error

from service.domain.records import Secret
from service.storage import keys, open_store
from service.storage.base import ObjectStore, StoreUnavailable
from service.storage.config import StoreConfig
from service.storage.scoped import TrainingScope, scoped_store, training_policy
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, moto_server

pytestmark = pytest.mark.integration

BUCKET = "dlaas"
TID = "tr-scoped-1"
OTHER = "tr-other-2"
ROLE_NAME = "dlaas-learners"
ROLE_ARN = f"arn:aws:iam::123456789012:role/{ROLE_NAME}"
ALLOW_ALL = {"Effect": "Allow", "Action": "*", "Resource": "*"}
TRUST = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
}
SCOPE = TrainingScope(
    training_id=TID,
    read_keys=(keys.model_definition_key(TID, "zip"),),
    read_prefixes=(),
    write_prefixes=(keys.results_prefix(TID), keys.attempt_checkpoints_prefix(TID, 1)),
)


def _platform(server: S3Server, key: tuple[str, str] = (ACCESS_KEY, SECRET_KEY)) -> StoreConfig:
    return StoreConfig(
        kind="s3",
        endpoint=server.url,
        access_key=Secret(key[0]),
        secret_key=Secret(key[1]),
        bucket=BUCKET,
    )


def _iam(server: S3Server, key: tuple[str, str]) -> Any:
    return boto3.client(
        "iam",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id=key[0],
        aws_secret_access_key=key[1],
    )


def platform_user(server: S3Server) -> tuple[str, str]:
    """On a server enforcing access control (its first 3 requests free): the platform's
    user, allowed everything, and its key."""
    iam = _iam(server, (ACCESS_KEY, SECRET_KEY))
    iam.create_user(UserName="platform")
    allow_all = {"Version": "2012-10-17", "Statement": [ALLOW_ALL]}
    iam.put_user_policy(UserName="platform", PolicyName="all", PolicyDocument=json.dumps(allow_all))
    key = iam.create_access_key(UserName="platform")["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def make_role(
    server: S3Server, key: tuple[str, str], role_policy: dict[str, object] | None
) -> None:
    """The learners' role in moto's IAM, with `role_policy` as its own policy."""
    iam = _iam(server, key)
    iam.create_role(RoleName=ROLE_NAME, AssumeRolePolicyDocument=json.dumps(TRUST))
    if role_policy is not None:
        iam.put_role_policy(
            RoleName=ROLE_NAME, PolicyName="training", PolicyDocument=json.dumps(role_policy)
        )


def _setup(
    server: S3Server,
    role_policy: dict[str, object] | None,
    key: tuple[str, str] = (ACCESS_KEY, SECRET_KEY),
) -> None:
    """The role (moto's IAM) and the bucket with two trainings' model definitions."""
    make_role(server, key, role_policy)
    client = server.client(*key)
    client.make_bucket(BUCKET)
    for tid, data in ((TID, b"mine"), (OTHER, b"theirs")):
        client.put_object(BUCKET, keys.model_definition_key(tid, "zip"), io.BytesIO(data), 4)


ENFORCING = {"INITIAL_NO_AUTH_ACTION_COUNT": "3"}


@pytest.fixture
def server() -> Iterator[S3Server]:
    with moto_server() as s:
        _setup(s, None)
        yield s


def test_the_scoped_credentials_read_the_model_and_write_results(server: S3Server) -> None:
    platform = _platform(server)
    store_config = scoped_store(platform, ROLE_ARN, SCOPE, 3600)
    assert store_config.session_token is not None
    assert store_config.access_key != platform.access_key
    assert store_config.secret_key != platform.secret_key
    assert (store_config.bucket, store_config.endpoint) == (BUCKET, server.url)

    store = open_store(store_config)
    with store.open(keys.model_definition_key(TID, "zip")) as f:
        assert f.read() == b"mine"
    key = keys.result_key(TID, "model/saved_model.pb")
    store.put_stream(key, io.BytesIO(b"pb"), 2)
    assert server.objects(BUCKET, keys.results_prefix(TID)) == {key: b"pb"}


def test_a_wrong_session_token_is_refused_where_moto_checks_credentials() -> None:
    """With access control on, moto checks the token that goes with an assumed role's
    key: the store passes it (one with another token is refused)."""
    with moto_server(env=ENFORCING) as server:
        key = platform_user(server)
        _setup(server, training_policy(BUCKET, SCOPE), key)
        scoped = scoped_store(_platform(server, key), ROLE_ARN, SCOPE, 3600)
        without = open_store(dataclasses.replace(scoped, session_token=Secret("wrong")))
        with pytest.raises(StoreUnavailable, match="refused access"):
            _read(without, keys.model_definition_key(TID, "zip"))
        assert _read(open_store(scoped), keys.model_definition_key(TID, "zip")) == b"mine"


def test_the_policy_enforced_by_moto() -> None:
    """The training's policy document, on the role (moto ignores session policies; see the
    module's docstring), refuses everything beyond the training's keys."""
    with moto_server(env=ENFORCING) as server:
        key = platform_user(server)
        _setup(server, training_policy(BUCKET, SCOPE), key)
        scoped = scoped_store(_platform(server, key), ROLE_ARN, SCOPE, 3600)
        client = Minio(
            server.netloc,
            access_key=Secret.reveal(scoped.access_key),
            secret_key=Secret.reveal(scoped.secret_key),
            session_token=Secret.reveal(scoped.session_token),
            secure=False,
            region="us-east-1",
        )

        def code_of(call: object) -> str:
            try:
                call()  # type: ignore[operator]
            except S3Error as e:
                return e.code
            return "ok"

        def get(key: str) -> object:
            return lambda: client.get_object(BUCKET, key).read()

        def put(key: str) -> object:
            return lambda: client.put_object(BUCKET, key, io.BytesIO(b"x"), 1)

        assert code_of(get(keys.model_definition_key(TID, "zip"))) == "ok"
        assert code_of(put(keys.result_key(TID, "out.txt"))) == "ok"
        assert code_of(put(keys.attempt_checkpoints_prefix(TID, 1) + "ckpt")) == "ok"
        assert code_of(get(keys.model_definition_key(OTHER, "zip"))) == "AccessDenied"
        assert code_of(put(keys.result_key(OTHER, "out.txt"))) == "AccessDenied"
        assert code_of(put(keys.model_definition_key(TID, "zip"))) == "AccessDenied"
        assert code_of(put(keys.training_prefix(TID) + "elsewhere")) == "AccessDenied"
        assert code_of(put("deployments/d1/model/x")) == "AccessDenied"
        assert code_of(lambda: client.remove_bucket(BUCKET)) == "AccessDenied"


def _read(store: ObjectStore, key: str) -> bytes:
    with store.open(key) as f:
        return f.read()


def test_the_backends_scope_lets_the_agent_store_its_metric_documents() -> None:
    """The scope the Kubernetes backend gives a training's pods (its policy on the role, as
    in `test_the_policy_enforced_by_moto`) lets the agent write its log and TensorBoard
    metric documents (keys.log_metrics_key, keys.tensorboard_metrics_key), and no other
    training's."""
    from tests.k8s.test_backend import request
    from worker.backends.kubernetes.learner_setup import training_scope

    scope = training_scope(request(TID))
    with moto_server(env=ENFORCING) as server:
        key = platform_user(server)
        _setup(server, training_policy(BUCKET, scope), key)
        store = open_store(scoped_store(_platform(server, key), ROLE_ARN, scope, 3600))
        for document in (keys.log_metrics_key(TID, 2), keys.tensorboard_metrics_key(TID, 1)):
            store.put_stream(document, io.BytesIO(b"{}"), 2)
            assert _read(store, document) == b"{}"
        with pytest.raises(StoreUnavailable):
            store.put_stream(keys.log_metrics_key(OTHER, 1), io.BytesIO(b"{}"), 2)
