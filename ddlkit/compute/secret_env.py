"""The channel that carries a job's secrets from the launcher to its ranks, in memory only.

The launcher splits the secrets out of the config it writes (:func:`ddlkit.redact.split_secrets`:
every file and logger gets ``***``) and hands the real values to the ranks in one environment
variable, :data:`SECRETS_ENV`, through the target's ``spec.secret_env``; a target whose scheduler
would log or keep that environment writes it to a file instead (:mod:`ddlkit.compute.secret_file`).
The worker reads it and puts the values back into its in-memory config.

::

    secret_env = {SECRETS_ENV: encode(secrets)}                    # the launcher (prepare)
    restore(config, decode(os.environ.get(SECRETS_ENV)))           # the rank's worker

Standard library only: the rank's worker imports it before anything heavy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["SECRETS_ENV", "decode", "encode", "restore"]

#: the environment variable holding the job's secrets, ``{dotted.config.path: value}`` as JSON
SECRETS_ENV = "DDLKIT_JOB_SECRETS"


def encode(secrets: Mapping[str, str]) -> str:
    return json.dumps(dict(secrets))


def decode(text: str | None) -> dict[str, str]:
    return json.loads(text) if text else {}


def restore(container: dict[str, Any], secrets: Mapping[str, str]) -> None:
    """Put each secret back at its dotted path (list items by index) in a plain config container."""
    for path, value in secrets.items():
        *parents, leaf = path.split(".")
        node: Any = container
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[int(leaf) if isinstance(node, list) else leaf] = value
