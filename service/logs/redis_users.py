"""Redis ACL users scoped to one training's log: what a learner's pod holds instead of the
platform's Redis URL (Redis 6 or later).

A training's user may run only what the agent's log sink (service.logs.redis) sends:
`XADD` through the append script (`EVALSHA`, and `SCRIPT LOAD` when the server lost the
script), `SELECT` (the URL's database) and `PING`; on the training's stream key only
(`~dlaas:logs:<training id>`, glob characters escaped). Commands a script runs are
checked against the same user, so the script reaches no other key either. `KEYS`,
`CONFIG`, `FLUSHALL`, `ACL`, reads and every other key are refused (NOPERM).

The user's name follows from the training id, so a restarted backend finds it again; its
password is random. `grant` adds a password to the user (creating it the first time) and
leaves the ones it has: a second start, whose Secret already exists, calls `revoke` to take
back the password it did not use, and the Secret's keeps working. `delete` removes the user
(cleanup); a user already gone is fine.

`user_name`, `acl_rules` and `user_url` are pure (tested as a table); `RedisLogUsers`
talks to Redis with the platform's URL, which needs the `ACL` command.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import redis

from service.logs.redis import RedisLogStore

# Every user this module makes is named with this prefix (what an operator greps for).
USER_PREFIX = "dlaas-log-"
# What the agent's log sink sends: the append script (loaded again if the server lost
# it), SELECT of the URL's database on connecting, and PING (a connection check). AUTH
# and HELLO need no permission.
COMMANDS = ("xadd", "evalsha", "script|load", "select", "ping")
_GLOB = re.compile(r"([*?\[\]\\])")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def user_name(training_id: str) -> str:
    """The ACL user of a training's log: its id, with anything but [A-Za-z0-9_.:-]
    replaced (a user name holds no spaces; the training's ids hold none of those)."""
    return USER_PREFIX + _NAME_UNSAFE.sub("_", training_id)


def key_pattern(training_id: str) -> str:
    """The training's stream key as an ACL key pattern: its glob characters escaped."""
    return "~" + _GLOB.sub(r"\\\1", RedisLogStore.key(training_id))


def acl_rules(training_id: str) -> list[str]:
    """The ACL SETUSER rules of the training's user, less its password: on, no command but
    COMMANDS, no key but the training's stream (and no pub/sub channel, as `-@all` grants
    none)."""
    return ["on", "resetkeys", key_pattern(training_id), "-@all", *(f"+{c}" for c in COMMANDS)]


def user_url(platform_url: str, username: str, password: str) -> str:
    """`platform_url` (redis:// or rediss://, its host, port, database and options) with
    the training's user and password instead of the platform's."""
    parts = urlsplit(platform_url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"not a redis:// or rediss:// URL: {parts.scheme}://")
    host = parts.hostname or "localhost"
    if ":" in host:  # IPv6
        host = f"[{host}]"
    netloc = f"{quote(username, safe='')}:{quote(password, safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def new_password() -> str:
    """A random password: 256 bits, hex (nothing to quote in a URL)."""
    return secrets.token_hex(32)


class RedisLogUsers:
    """Creates, narrows and deletes trainings' log users on the platform's Redis."""

    def __init__(self, platform_url: str) -> None:
        self.platform_url = platform_url
        self.client = redis.Redis.from_url(platform_url, socket_connect_timeout=5)
        # The ACL subcommands as Redis takes them (redis-py's acl_setuser spells rules as
        # keyword arguments; these are the rules' own words).
        self._command: Callable[..., Any] = self.client.execute_command

    def grant(self, training_id: str) -> tuple[str, str]:
        """A new password for the training's user (created on first use, its rules set
        again), and the URL a learner's log sink opens with it: (url, password)."""
        password = new_password()
        self._command(
            "ACL", "SETUSER", user_name(training_id), *acl_rules(training_id), f">{password}"
        )
        return user_url(self.platform_url, user_name(training_id), password), password

    def revoke(self, training_id: str, password: str) -> None:
        """Take back one password (a start's whose Secret was there already, or that
        failed); the user and its other passwords stay. One taken back already, or a user
        gone, is fine."""
        if not self.exists(training_id):
            return
        try:
            self._command("ACL", "SETUSER", user_name(training_id), f"<{password}")
        except redis.ResponseError as e:
            if "does not exist" not in str(e):
                raise

    def keep_only(self, training_id: str, password: str) -> None:
        """The user's passwords reduced to `password` (what a new Secret carries): those an
        older attempt's Secret held stop working."""
        self._command("ACL", "SETUSER", user_name(training_id), "resetpass", f">{password}")

    def exists(self, training_id: str) -> bool:
        return self._command("ACL", "GETUSER", user_name(training_id)) is not None

    def delete(self, training_id: str) -> None:
        """Remove the training's user; its open connections are closed by Redis."""
        self._command("ACL", "DELUSER", user_name(training_id))

    def close(self) -> None:
        self.client.close()
