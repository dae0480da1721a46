"""Keeping secrets (storage keys, SAS tokens, API keys) out of files and logs.

Config values under secret-looking keys are replaced by ``"***"`` in every copy written to disk or handed to a
logger, and so are credentials inside any other value: the query string of a URL that carries a SAS
(``https://acct.blob.core.windows.net/c?sv=...&sig=...`` -> ``https://acct.blob.core.windows.net/c?***``) and a
connection string's ``AccountKey=``. The real values reach the ranks by a channel of their own
(:mod:`ddlkit.compute.secret_env`), never through a file or a log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"

_SECRET_KEY = re.compile(
    r"(^|_)(key|keys|token|secret|password|passwd|sas|sas_token|connection_string|credential|credentials|api_key)$",
    re.IGNORECASE,
)


#: a run of ``name=value`` pairs joined by ``&`` with a ``sig=`` among them: a SAS token, bare or as a URL's query
_SAS = re.compile(
    r"(?:\b[A-Za-z][\w-]*=[^&;?\s'\"#]*&)*\bsig=[^&;?\s'\"#]*(?:&[A-Za-z][\w-]*=[^&;?\s'\"#]*)*", re.IGNORECASE
)
#: ``AccountKey=...`` (and ``SharedAccessKey=``...) in a connection string
_CONN_KEY = re.compile(r"\b((?:Account|SharedAccess)Key|SharedAccessSignature)=[^;\s'\"]+", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def redact_text(text: str) -> str:
    """``text`` with the credentials a value can carry without a secret-looking key replaced by
    ``***``: a SAS (``sv=...&sig=...``, alone or as a URL's query string) and ``AccountKey=``."""
    if "=" not in text:
        return text
    text = _CONN_KEY.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    return _SAS.sub(REDACTED, text)


def has_credentials(text: str) -> bool:
    """Whether ``text`` carries a credential that :func:`redact_text` removes."""
    return redact_text(text) != text


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
                elif isinstance(v, str) and has_credentials(v):
                    # a SAS in a URL: the files get the URL without it, the ranks the whole value
                    found[p] = v
                    out[k] = redact_text(v)
                else:
                    out[k] = walk(v, p)
            return out
        if isinstance(node, list):
            out_list = []
            for i, v in enumerate(node):
                if isinstance(v, str) and has_credentials(v):
                    found[f"{path}.{i}"] = v
                    out_list.append(redact_text(v))
                else:
                    out_list.append(walk(v, f"{path}.{i}"))
            return out_list
        return node

    return walk(container, prefix), found


def _override_is_secret(override: str) -> bool:
    key, sep, value = override.partition("=")
    return bool(sep and value and is_secret_key(key.lstrip("+~").rsplit(".", 1)[-1]))


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    """Command-line overrides (or argv) with secret values replaced: ``storage.sas_token=***``,
    and credentials in any other value removed (``storage.account_url='https://a/c?***'``)."""
    out = []
    for override in overrides:
        key = override.partition("=")[0]
        out.append(f"{key}={REDACTED}" if _override_is_secret(override) else redact_text(override))
    return out


def override_secrets(overrides: Iterable[str]) -> dict[str, str]:
    """The secret values given on a command line (``logger.wandb.api_key=V``, also quoted or
    swept: ``k='V'``, ``k=V1,V2``), for :func:`scrub` to remove from anything printed."""
    found: dict[str, str] = {}
    for i, override in enumerate(overrides):
        if not _override_is_secret(override):
            continue
        value = override.partition("=")[2]
        candidates = {value, value.strip("'\""), *(v.strip(" '\"") for v in value.split(","))}
        if value.startswith(("choice(", "glob(")):
            candidates |= {v.strip(" '\"()") for v in value.partition("(")[2].split(",")}
        for j, candidate in enumerate(sorted(candidates, key=len, reverse=True)):
            found[f"argv.{i}.{j}"] = candidate
    return found


def scrub(text: str, secrets: Mapping[str, str]) -> str:
    """Remove secret values from free text (error messages) before it is printed, and any
    credential :func:`redact_text` recognises."""
    for value in sorted(secrets.values(), key=len, reverse=True):
        if len(value) >= 4:
            text = text.replace(value, REDACTED)
    return redact_text(text)


def redact_config_file(path: Any) -> None:
    """Rewrite a config file written by Hydra (a sweep's ``multirun.yaml``: the composed config
    and the command line) with its secrets redacted as in :func:`split_secrets`, the secret
    overrides as in :func:`redact_overrides`, and their values removed wherever else they appear
    (``hydra.job.override_dirname``)."""
    from pathlib import Path

    from omegaconf import OmegaConf

    path = Path(path)
    if not path.is_file():
        return
    container = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    redacted, found = split_secrets(container)
    overrides = (redacted.get("hydra") or {}).get("overrides") or {}
    for name, values in list(overrides.items()):
        if isinstance(values, list):
            found.update({f"{name}.{k}": v for k, v in override_secrets(map(str, values)).items()})
            overrides[name] = redact_overrides(map(str, values))
    text = scrub(OmegaConf.to_yaml(OmegaConf.create(redacted)), found)
    path.write_text(text, encoding="utf-8")


class RedactingStream:
    """A text stream (``sys.stdout``, ``sys.stderr``) that :func:`scrub`\\ s what is written to it:
    put around code that may print what it was given (Hydra's ``--cfg``, ``--info``, ``--help``
    and its error messages echo overrides). Everything but writing is the wrapped stream's."""

    def __init__(self, stream: Any, secrets: Mapping[str, str]) -> None:
        self._stream = stream
        self._secrets = dict(secrets)

    def write(self, text: str) -> int:
        self._stream.write(scrub(text, self._secrets))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
