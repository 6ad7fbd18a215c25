"""A learner pod's credentials used against other trainings: what the Kubernetes backend
puts in a training's Secret (its learners' specs) reaches that training only. The backend
runs through the official client against the emulated API server (tests/k8s_emulator.py),
its store on moto (STS AssumeRole with a role set) and its log store on a real Redis (this
test run's own, tests/run_redis.py), where each training's learners get a Redis ACL user
of their own (service.logs.redis_users).

- No pod and no Secret of a training holds the platform's Redis URL or S3 keys.
- With the log credentials of one training's Secret: its own stream is written; another
  training's stream can be neither read nor written (directly, or through the append
  script), and KEYS, CONFIG, FLUSHALL, ACL and reads are refused.
- The user is gone after cleanup (its credentials stop working); a second start (a
  restarted backend finding the training again) keeps one user, whose password in the
  Secret still works, and adds none.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kubernetes import client, config

from service.domain.records import Secret
from service.logs.base import LogBlock, LogRecord, LogStoreUnavailable
from service.logs.config import LogSinkConfig
from service.logs.redis import RedisLogStore
from service.logs.redis_users import USER_PREFIX, RedisLogUsers, user_name
from service.storage import scoped
from service.storage.config import StoreConfig
from tests import run_redis
from tests.k8s.conftest import NAMESPACE
from tests.k8s.test_backend import CLUSTER, request
from tests.k8s_emulator import running_apiserver
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, moto_server
from worker.backends.kubernetes.backend import KubernetesBackend

pytestmark = pytest.mark.integration


def platform_redis() -> str:
    """The platform's log store: this run's own Redis (tests/run_redis.py), as the
    trainings' names and their ACL users are the same in every run."""
    return run_redis.url(14)


ROLE = "arn:aws:iam::123456789012:role/dlaas-learners"
MINE, OTHER = "training-cred1", "training-cred2"


@pytest.fixture
def core(tmp_path: Path) -> Iterator[client.CoreV1Api]:
    with running_apiserver(tmp_path) as apiserver:
        api = config.new_client_from_config(config_file=str(apiserver.kubeconfig))
        try:
            yield client.CoreV1Api(api)
        finally:
            api.close()


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        server.make_bucket("dlaas", {})
        yield server


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(platform_redis(), decode_responses=True)
    yield r
    for training in (MINE, OTHER):
        r.delete(RedisLogStore.key(training))
        r.execute_command("ACL", "DELUSER", user_name(training))
    r.close()


@pytest.fixture
def make_backend(
    core: client.CoreV1Api, s3: S3Server, admin: redis.Redis
) -> Iterator[Callable[[], KubernetesBackend]]:
    made: list[KubernetesBackend] = []

    def make() -> KubernetesBackend:
        backend = KubernetesBackend(
            core.api_client,
            CLUSTER,
            stop_grace_seconds=1,
            store_role_arn=ROLE,
            log_users=RedisLogUsers(platform_redis()),
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def start(backend: KubernetesBackend, s3: S3Server, training_id: str) -> None:
    platform_store = StoreConfig(
        kind="s3",
        endpoint=s3.url,
        access_key=Secret(ACCESS_KEY),
        secret_key=Secret(SECRET_KEY),
        bucket="dlaas",
    )
    backend.start(
        dataclasses.replace(
            request(training_id),
            store=platform_store,
            log_sink=LogSinkConfig(kind="redis", url=platform_redis()),
        )
    )


def objects(core: client.CoreV1Api, training_id: str) -> list[dict[str, Any]]:
    """The training's Secret and pods as the API holds them, learner specs decoded."""
    selector = f"dlaas.io/training-id={training_id}"
    serialize = client.ApiClient().sanitize_for_serialization
    found = [
        serialize(p) for p in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    ]
    for secret in core.list_namespaced_secret(NAMESPACE, label_selector=selector).items:
        data = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        found.append({**serialize(secret), "data": data})
    return found


def log_urls(core: client.CoreV1Api, training_id: str) -> set[str]:
    """The log sink URLs in the training's learner specs (its Secret)."""
    (secret,) = core.list_namespaced_secret(
        NAMESPACE, label_selector=f"dlaas.io/training-id={training_id}"
    ).items
    specs = [
        json.loads(base64.b64decode(v)) for k, v in secret.data.items() if k.startswith("learner-")
    ]
    return {spec["log_sink"]["url"] for spec in specs}


def users(admin: redis.Redis) -> list[str]:
    return [
        u
        for u in admin.execute_command("ACL", "USERS")
        if u.startswith(USER_PREFIX + "training-cred")
    ]


def test_no_pod_or_secret_holds_the_platforms_redis_url_or_s3_keys(
    make_backend: Callable[[], KubernetesBackend], core: client.CoreV1Api, s3: S3Server
) -> None:
    start(make_backend(), s3, MINE)
    found = objects(core, MINE)
    assert {o["kind"] for o in found} == {"Pod", "Secret"} and len(found) == 3
    text = json.dumps(found)
    for platform_secret in (platform_redis(), ACCESS_KEY, SECRET_KEY):
        assert platform_secret not in text
    (url,) = log_urls(core, MINE)
    assert url.startswith(f"redis://{user_name(MINE)}:")
    for pod in (o for o in found if o["kind"] == "Pod"):
        assert pod["spec"]["automountServiceAccountToken"] is False


def test_a_learners_log_credentials_reach_its_own_stream_only(
    make_backend: Callable[[], KubernetesBackend],
    core: client.CoreV1Api,
    s3: S3Server,
    admin: redis.Redis,
) -> None:
    backend = make_backend()
    start(backend, s3, MINE)
    start(backend, s3, OTHER)
    admin.xadd(RedisLogStore.key(OTHER), {"learner": "1", "ts": "1.0", "line": "other's secret"})
    (url,) = log_urls(core, MINE)
    sink = RedisLogStore(url)
    try:
        sink.append(MINE, [LogRecord(1, 1.0, "mine")])
        admin.script_flush()  # the sink loads the append script again itself
        sink.append(MINE, [LogRecord(1, 2.0, "mine again")])
        # What the log tee sends: blocks, through a script of their own, loaded by the sink.
        sink.append_blocks(MINE, [LogBlock(1, 3.0, ["block", "of lines"])])
        admin.script_flush()
        sink.append_blocks(MINE, [LogBlock(2, 4.0, ["again"])])
        assert [f["line"] for _, f in admin.xrange(RedisLogStore.key(MINE))] == [
            "mine",
            "mine again",
            "block",
            "of lines",
            "again",
        ]

        other = RedisLogStore.key(OTHER)
        attacks: list[Callable[[], Any]] = [
            lambda: sink.append(OTHER, [LogRecord(1, 1.0, "forged")]),
            lambda: sink.append_blocks(OTHER, [LogBlock(1, 1.0, ["forged"])]),
            lambda: sink.client.xadd(other, {"line": "forged"}),
            lambda: sink.client.xrange(other),
            lambda: sink.client.xread({other: "0-0"}),
            lambda: sink.client.xrange(RedisLogStore.key(MINE)),
            lambda: sink.client.delete(other),
            lambda: sink.client.keys("*"),
            lambda: sink.client.execute_command("CONFIG", "GET", "requirepass"),
            lambda: sink.client.flushall(),
            lambda: sink.client.execute_command("ACL", "LIST"),
            lambda: sink.client.execute_command("ACL", "SETUSER", user_name(MINE), "+@all"),
            lambda: sink.client.eval("return redis.call('XRANGE', KEYS[1], '-', '+')", 1, other),
        ]
        for attack in attacks:
            with pytest.raises(redis.exceptions.NoPermissionError):
                attack()
    finally:
        sink.close()
    assert [f["line"] for _, f in admin.xrange(RedisLogStore.key(OTHER))] == ["other's secret"]


def test_the_log_user_is_gone_after_cleanup(
    make_backend: Callable[[], KubernetesBackend],
    core: client.CoreV1Api,
    s3: S3Server,
    admin: redis.Redis,
) -> None:
    backend = make_backend()
    start(backend, s3, MINE)
    (url,) = log_urls(core, MINE)
    assert users(admin) == [user_name(MINE)]
    backend.cleanup(MINE)
    assert users(admin) == []
    sink = RedisLogStore(url)
    try:
        with pytest.raises(LogStoreUnavailable, match="invalid username-password"):
            sink.append(MINE, [LogRecord(1, 1.0, "after the end")])
    finally:
        sink.close()
    backend.cleanup(MINE)  # a second cleanup (a FINALIZE again) finds nothing to delete


def test_a_restarted_backend_keeps_the_one_user_and_its_password(
    make_backend: Callable[[], KubernetesBackend],
    core: client.CoreV1Api,
    s3: S3Server,
    admin: redis.Redis,
) -> None:
    start(make_backend(), s3, MINE)
    (url,) = log_urls(core, MINE)
    start(make_backend(), s3, MINE)  # a new backend starts the training again
    assert log_urls(core, MINE) == {url}  # the Secret is the first start's
    assert users(admin) == [user_name(MINE)]
    # One password: the Secret's (the second start's own was taken back).
    (user,) = [u for u in admin.execute_command("ACL", "LIST") if f"user {user_name(MINE)} " in u]
    assert user.count("#") == 1
    sink = RedisLogStore(url)
    try:
        sink.append(MINE, [LogRecord(1, 1.0, "still mine")])
    finally:
        sink.close()
    assert admin.xlen(RedisLogStore.key(MINE)) == 1


def test_a_new_attempt_takes_the_older_attempts_password_back(
    make_backend: Callable[[], KubernetesBackend],
    core: client.CoreV1Api,
    s3: S3Server,
    admin: redis.Redis,
) -> None:
    backend = make_backend()
    start(backend, s3, MINE)
    (first,) = log_urls(core, MINE)
    backend.stop(MINE)
    second_attempt = dataclasses.replace(
        request(MINE, attempt=2),
        store=StoreConfig(
            kind="s3",
            endpoint=s3.url,
            access_key=Secret(ACCESS_KEY),
            secret_key=Secret(SECRET_KEY),
            bucket="dlaas",
        ),
        log_sink=LogSinkConfig(kind="redis", url=platform_redis()),
    )
    backend.start(second_attempt)
    (second,) = log_urls(core, MINE)
    assert second != first and users(admin) == [user_name(MINE)]
    for url, works in ((first, False), (second, True)):
        sink = RedisLogStore(url)
        try:
            if works:
                sink.append(MINE, [LogRecord(1, 1.0, "attempt 2")])
            else:
                with pytest.raises(LogStoreUnavailable):
                    sink.append(MINE, [LogRecord(1, 1.0, "attempt 1")])
        finally:
            sink.close()


def test_the_store_session_lasts_the_trainings_run_and_wrap_up_not_the_longest(
    make_backend: Callable[[], KubernetesBackend],
    s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """request() has max_runtime 600: the credentials last 600 s and the margin for fetching
    and storing, not DLAAS_STORE_SESSION_MAX_SECONDS (12 h)."""
    asked: list[int] = []
    real = scoped.scoped_store

    def recorded(store: StoreConfig, role: str, scope: Any, duration: int) -> StoreConfig:
        asked.append(duration)
        return real(store, role, scope, duration)

    monkeypatch.setattr(scoped, "scoped_store", recorded)
    start(make_backend(), s3, MINE)
    assert asked == [600 + scoped.SESSION_MARGIN_SECONDS]
    assert 600 + scoped.SESSION_MARGIN_SECONDS < scoped.MAX_SESSION_SECONDS


def test_a_failed_start_leaves_no_log_password_that_works(
    core: client.CoreV1Api, s3: S3Server, admin: redis.Redis
) -> None:
    """The role cannot be assumed (after the log user got its password): the start fails
    having created nothing, and the password it made is taken back."""
    backend = KubernetesBackend(
        core.api_client,
        CLUSTER,
        store_role_arn="not-an-arn",
        log_users=RedisLogUsers(platform_redis()),
    )
    try:
        with pytest.raises(Exception, match="RoleArn"):
            start(backend, s3, MINE)
    finally:
        backend.close()
    assert core.list_namespaced_secret(NAMESPACE).items == []
    rules = [u for u in admin.execute_command("ACL", "LIST") if f"user {user_name(MINE)} " in u]
    assert all("#" not in rule and "nopass" not in rule for rule in rules), rules
