"""Where the client finds its API and key when nothing is passed.

Order: the arguments of `Client(url, api_key)`; then `DLAAS_URL` and `DLAAS_API_KEY`; then
the client configuration file that `dlaas up` writes, `$DLAAS_CONFIG` if set, else
`$DLAAS_HOME/client.json` (`~/.dlaas/client.json` by default), mode 0600:

    {"url": "http://127.0.0.1:8080", "api_key": "dlaas_...", "tenant": "local"}

The URL falls back to http://127.0.0.1:8080, what `dlaas up` listens on by default.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8080"
CONFIG_FILE_NAME = "client.json"


def dlaas_home() -> Path:
    """`$DLAAS_HOME`, or `~/.dlaas`: where `dlaas up` keeps the platform's state."""
    return Path(os.environ.get("DLAAS_HOME") or "~/.dlaas").expanduser()


def config_path(home: Path | None = None) -> Path:
    """The client configuration file: `$DLAAS_CONFIG`, else `<home>/client.json`."""
    explicit = os.environ.get("DLAAS_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    return (home if home is not None else dlaas_home()) / CONFIG_FILE_NAME


@dataclass(frozen=True)
class ClientConfig:
    url: str
    api_key: str | None = None
    tenant: str | None = None


def load_config(path: Path | None = None) -> ClientConfig | None:
    """The configuration at `path` (default `config_path()`), or None if there is none or
    it is not a JSON object with a `url`."""
    path = path or config_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        return None
    key = data.get("api_key")
    tenant = data.get("tenant")
    return ClientConfig(
        url=data["url"],
        api_key=key if isinstance(key, str) and key else None,
        tenant=tenant if isinstance(tenant, str) else None,
    )


def write_config(config: ClientConfig, path: Path | None = None) -> Path:
    """Write `config` atomically, readable by its owner only (0600); returns the path."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(config), f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    return path
