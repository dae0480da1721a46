"""Keeping secrets (storage keys, SAS tokens, API keys) out of files and logs.

Config values under secret-looking keys are replaced by ``"***"`` in every copy written to
disk or handed to a logger. The launcher passes the real values to the ranks in the
environment variable :data:`SECRETS_ENV`, and the worker puts them back in memory only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"
SECRETS_ENV = "DDLKIT_JOB_SECRETS"

_SECRET_KEY = re.compile(
    r"(^|_)(key|keys|token|secret|password|passwd|sas|sas_token|connection_string|credential|credentials|api_key)$",
    re.IGNORECASE,
)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def split_secrets(container: Any, prefix: str = "") -> tuple[Any, dict[str, str]]:
    """Return (copy with secrets redacted, {dotted.path: secret value})."""
    found: dict[str, str] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, Mapping):
            out = {}
            for k, v in node.items():
                p = f"{path}.{k}" if path else str(k)
                if is_secret_key(str(k)) and isinstance(v, str) and v and v != REDACTED:
                    found[p] = v
                    out[k] = REDACTED
                else:
                    out[k] = walk(v, p)
            return out
        if isinstance(node, list):
            return [walk(v, f"{path}.{i}") for i, v in enumerate(node)]
        return node

    return walk(container, prefix), found


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    """Command-line overrides (or argv) with secret values replaced: ``storage.sas_token=***``."""
    out = []
    for override in overrides:
        key, sep, value = override.partition("=")
        secret = sep and value and is_secret_key(key.lstrip("+~").rsplit(".", 1)[-1])
        out.append(f"{key}={REDACTED}" if secret else override)
    return out


def restore_secrets(container: dict[str, Any], secrets: Mapping[str, str]) -> None:
    for path, value in secrets.items():
        *parents, leaf = path.split(".")
        node: Any = container
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[leaf] = value


def encode(secrets: Mapping[str, str]) -> str:
    return json.dumps(dict(secrets))


def decode(text: str | None) -> dict[str, str]:
    return json.loads(text) if text else {}


def scrub(text: str, secrets: Mapping[str, str]) -> str:
    """Remove secret values from free text (error messages) before it is printed."""
    for value in secrets.values():
        if len(value) >= 4:
            text = text.replace(value, REDACTED)
    return text
