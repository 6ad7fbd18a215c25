"""The Redis ACL user of a training's log, as pure data (service.logs.redis_users): its
name, its rules (no command but the log sink's, no key but the training's stream) and the
URL a learner's log sink opens with it. Against a real Redis: tests/security/
test_pod_credentials.py."""

from __future__ import annotations

import pytest

from service.logs.redis_users import acl_rules, key_pattern, user_name, user_url


@pytest.mark.parametrize(
    ("training_id", "name", "pattern"),
    [
        ("training-abc123", "dlaas-log-training-abc123", "~dlaas:logs:training-abc123"),
        # Glob characters of an id match themselves only; a name holds no space.
        ("t*[a]?\\", "dlaas-log-t__a___", "~dlaas:logs:t\\*\\[a\\]\\?\\\\"),
        ("a b", "dlaas-log-a_b", "~dlaas:logs:a b"),
    ],
)
def test_user_name_and_key_pattern(training_id: str, name: str, pattern: str) -> None:
    assert user_name(training_id) == name
    assert key_pattern(training_id) == pattern


def test_the_rules_allow_the_log_sinks_commands_on_its_stream_only() -> None:
    assert acl_rules("training-1") == [
        "on",
        "resetkeys",
        "~dlaas:logs:training-1",
        "-@all",
        "+xadd",
        "+evalsha",
        "+script|load",
        "+select",
        "+ping",
    ]


@pytest.mark.parametrize(
    ("platform", "url"),
    [
        ("redis://:platform-pw@redis.dlaas:6379/1", "redis://u:p%2Fw@redis.dlaas:6379/1"),
        ("redis://admin:pw@10.0.0.5/0", "redis://u:p%2Fw@10.0.0.5/0"),
        (
            "rediss://[fd00::1]:6380/2?ssl_cert_reqs=required",
            "rediss://u:p%2Fw@[fd00::1]:6380/2?ssl_cert_reqs=required",
        ),
    ],
)
def test_the_url_keeps_the_server_and_database_not_the_platforms_user(
    platform: str, url: str
) -> None:
    assert user_url(platform, "u", "p/w") == url


def test_a_url_that_is_not_redis_is_refused() -> None:
    with pytest.raises(ValueError, match="not a redis"):
        user_url("unix:///run/redis.sock", "u", "p")
