"""ProxyConfig: every setting of one proxy, with its default and the reason for it.

Owns: the option names (one spelling, shared by the CLI flags and `MODELTAP_<OPTION>` environment
variables), defaults, and validation. Does not own: parsing argv (cli.py) or acting on a setting.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modeltap.compat.layouts import LAYOUTS, Layout

DEFAULT_STORE = ".modeltap/records.db"
# Agents paste whole files and base64 images into prompts, so aiohttp's 1 MiB default would answer
# them 413; 64 MiB covers a 128k-token transcript with several images many times over.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# Connecting to a live upstream on the same host or LAN takes milliseconds; 10 s means it is down.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# The longest silence allowed between two chunks of an upstream response. AReaL generates the whole
# completion before it sends the first byte, even when streaming (areal-proxy-protocol.md §1.1), and
# its own client waits up to an hour (rollout.request_timeout, §4.3), so the default is that hour.
DEFAULT_READ_TIMEOUT_S = 3600.0
# A client that has not finished sending its headers and body within this is treated as gone
# (slowloris); the largest legitimate body on loopback arrives in well under a second.
DEFAULT_CLIENT_TIMEOUT_S = 60.0
# Sessions idle longer than this are closed: AReaL's own proxy forgets its sessions after an hour
# (rollout.agent.session_timeout_seconds, areal-proxy-protocol.md §5.1), so a longer-lived token
# would only point at an upstream session that no longer exists.
DEFAULT_SESSION_TTL_S = 3600.0
BUDGET_POLICIES = ("clamp", "reject", "off")


@dataclass
class ProxyConfig:
    """Settings of one modeltap proxy.

    >>> ProxyConfig(upstream="http://127.0.0.1:8000", host="127.0.0.1").layout
    'auto'
    """

    upstream: str | None = None
    host: str = "0.0.0.0"
    port: int = 0
    layout: Layout = "auto"
    upstream_key: str | None = field(default=None, repr=False)
    model: str | None = None
    store: str = DEFAULT_STORE
    admin_key: str | None = field(default=None, repr=False)
    sync: bool = False
    tokenizer: str | None = None
    context_length: int | None = None
    engine_max_tokens: int | None = None
    reserve: int = 0
    budget: str = "clamp"
    min_completion_tokens: int = 1
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    lend_key_to_anonymous: bool = False
    admin_remote: bool = False
    session_ttl_s: float = DEFAULT_SESSION_TTL_S
    keep_raw_sse: bool = False

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {self.layout!r}")
        if self.budget not in BUDGET_POLICIES:
            raise ValueError(f"budget must be one of {', '.join(BUDGET_POLICIES)}, not {self.budget!r}")
        if self.upstream is not None:
            self.upstream = self.upstream.rstrip("/")
            if not self.upstream.startswith(("http://", "https://")):
                raise ValueError(f"upstream must be an http(s) URL, not {self.upstream!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, not {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")

    @property
    def store_path(self) -> Path:
        return Path(self.store)

    @classmethod
    def from_sources(cls, flags: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> ProxyConfig:
        """Merge flags over `MODELTAP_<OPTION>` environment variables over defaults.

        A flag given as None counts as absent, so the environment fills it.
        """
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if flags.get(f.name) is not None:
                values[f.name] = flags[f.name]
            elif (raw := env.get("MODELTAP_" + f.name.upper())) is not None:
                values[f.name] = _parse_env(f, raw)
        return cls(**values)


def _parse_env(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    if kind.startswith("bool"):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind.startswith("int"):
        return int(raw)
    if kind.startswith("float"):
        return float(raw)
    if kind.startswith("dict"):
        return json.loads(raw)
    return raw
