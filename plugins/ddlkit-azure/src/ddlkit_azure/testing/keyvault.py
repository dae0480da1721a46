"""A loopback Azure Key Vault (secrets): the REST API ``azure-keyvault-secrets`` talks to, served
as plain HTTP on 127.0.0.1 behind an :class:`~ddlkit_azure.testing.loopback.InterceptingProxy`
that carries ``https://<name>.vault.azure.net`` to it (the SDK checks that the vault's challenge
names a resource its host belongs to, so the vault must be reached by its own host name).

It follows the published API (secrets, api-version 7.x):

* Key Vault's challenge authentication: a request without a bearer token is answered 401 with
  ``WWW-Authenticate: Bearer authorization="https://login.microsoftonline.com/<tenant>",
  resource="https://vault.azure.net"`` (the SDK then asks its credential for that resource's token
  and sends the request again);
* ``PUT /secrets/{name}`` (value, contentType, tags, attributes: ``exp``, ``nbf``, ``enabled``) ->
  the secret bundle, a new version; ``GET /secrets/{name}[/{version}]``; ``DELETE /secrets/{name}``
  -> the deleted secret bundle (soft delete: ``recoveryId``), then ``GET /deletedsecrets/{name}``;
* ``SecretNotFound`` (404) for a secret it does not have, ``Forbidden`` (403, ``ForbiddenByRbac``)
  for a caller :meth:`LoopbackKeyVault.refuse` names (by the ``oid`` of its token), and for an
  expired or disabled secret's value.

The token is read, not verified (its ``oid`` says who calls). Every request is in
:meth:`LoopbackServer.requests <ddlkit_azure.testing.loopback.LoopbackServer.requests>` of
:attr:`LoopbackKeyVault.server` (the PUT bodies hold the values: this is the vault).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .loopback import TOKEN_CLAIMS, Certificate, LoopbackServer, Request, Response, error_body

#: the resource Key Vault's challenge names (its tokens' audience)
RESOURCE = "https://vault.azure.net"


@dataclass
class StoredSecret:
    name: str
    value: str
    version: str
    tags: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    deleted: float | None = None


class LoopbackKeyVault:
    """A key vault named ``name`` (``https://<name>.vault.azure.net``), started and stopped with its server."""

    def __init__(self, certificate: Certificate, name: str = "kv-ddlkit", *, tenant: str = TOKEN_CLAIMS["tid"]):
        self.name, self.tenant = name, tenant
        self.server = LoopbackServer(certificate, tls=False)
        #: name -> the secret (its latest version), deleted ones too (until purged)
        self.secrets: dict[str, StoredSecret] = {}
        #: (principal (a token's ``oid``), method) refused with 403; method "*": every request
        self.refused: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._register_routes()

    @property
    def host(self) -> str:
        return f"{self.name}.vault.azure.net"

    @property
    def url(self) -> str:
        return f"https://{self.host}"

    @property
    def arm_id(self) -> str:
        return f"/subscriptions/sub-0001/resourceGroups/rg-ddlkit/providers/Microsoft.KeyVault/vaults/{self.name}"

    def start(self) -> LoopbackKeyVault:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> LoopbackKeyVault:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def refuse(self, principal: str, *methods: str) -> None:
        """Answer 403 to ``principal``'s (a token's ``oid``) requests of ``methods`` (none: every
        request: it has no role on the vault)."""
        self.refused.update((principal, method.upper()) for method in methods or ("*",))

    def live(self) -> dict[str, StoredSecret]:
        """The secrets not deleted."""
        with self._lock:
            return {n: s for n, s in self.secrets.items() if s.deleted is None}

    # ------------------------------------------------------------ the API
    def _register_routes(self) -> None:
        s = self.server
        s.route("PUT", r"/secrets/(?P<name>[0-9A-Za-z-]+)", self._authorized(self._put))
        s.route("GET", r"/secrets/(?P<name>[0-9A-Za-z-]+)(?:/(?P<version>[0-9a-f]*))?", self._authorized(self._get))
        s.route("DELETE", r"/secrets/(?P<name>[0-9A-Za-z-]+)", self._authorized(self._delete))
        s.route("GET", r"/deletedsecrets/(?P<name>[0-9A-Za-z-]+)", self._authorized(self._get_deleted))

    def _authorized(self, handler: Any) -> Any:
        def checked(r: Request, m: re.Match[str]) -> Any:
            if r.auth_scheme != "Bearer":
                return Response(
                    401,
                    error_body("Unauthorized", "AKV10000: Request is missing a Bearer or PoP token."),
                    headers={
                        "WWW-Authenticate": f'Bearer authorization="https://login.microsoftonline.com/{self.tenant}", '
                        f'resource="{RESOURCE}"'
                    },
                )
            if {(str(r.principal), r.method), (str(r.principal), "*")} & self.refused:
                action = {"PUT": "setSecret", "GET": "getSecret", "DELETE": "deleteSecret"}[r.method]
                return Response(
                    403,
                    {
                        "error": {
                            "code": "Forbidden",
                            "message": f"Caller is not authorized to perform action on resource. If role assignments "
                            f"were recently changed, please wait several minutes for role assignments to become "
                            f"effective. Caller: oid={r.principal};Action: "
                            f"'Microsoft.KeyVault/vaults/secrets/{action}/action';resource: '{self.arm_id}/secrets/"
                            f"{m['name']}';Assignment: (not found);Vault: {self.name};location=westeurope",
                            "innererror": {"code": "ForbiddenByRbac"},
                        }
                    },
                )
            return handler(r, m)

        return checked

    def _bundle(self, secret: StoredSecret, *, value: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": f"{self.url}/secrets/{secret.name}/{secret.version}",
            "attributes": {**secret.attributes, "recoveryLevel": "Recoverable+Purgeable", "recoverableDays": 90},
            "tags": secret.tags,
        }
        if value:
            body["value"] = secret.value
        if secret.content_type:
            body["contentType"] = secret.content_type
        if secret.deleted is not None:
            body.update(
                recoveryId=f"{self.url}/deletedsecrets/{secret.name}",
                deletedDate=int(secret.deleted),
                scheduledPurgeDate=int(secret.deleted) + 90 * 86400,
            )
        return body

    def _missing(self, name: str) -> Response:
        return Response(
            404,
            error_body(
                "SecretNotFound",
                f"A secret with (name/id) {name} was not found in this key vault. If you recently deleted this "
                "secret you may be able to recover it using the correct recovery command.",
            ),
        )

    def _put(self, r: Request, m: re.Match[str]) -> Any:
        body = r.body or {}
        now = int(time.time())
        with self._lock:
            old = self.secrets.get(m["name"])
            if old is not None and old.deleted is not None:
                return Response(
                    409,
                    error_body("Conflict", f"Secret {m['name']} is currently in a deleted but recoverable state."),
                )
            secret = StoredSecret(
                name=m["name"],
                value=str(body["value"]),
                version=uuid.uuid4().hex,
                tags=dict(body.get("tags") or {}),
                content_type=body.get("contentType"),
                attributes={"enabled": True, **(body.get("attributes") or {}), "created": now, "updated": now},
            )
            self.secrets[secret.name] = secret
        return self._bundle(secret)

    def _get(self, r: Request, m: re.Match[str]) -> Any:
        with self._lock:
            secret = self.secrets.get(m["name"])
        if secret is None or secret.deleted is not None or m["version"] and m["version"] != secret.version:
            return self._missing(m["name"])
        attributes = secret.attributes
        if not attributes.get("enabled", True) or attributes.get("exp") and attributes["exp"] < time.time():
            return Response(
                403, error_body("Forbidden", "Operation get is not allowed on a disabled or expired secret.")
            )
        return self._bundle(secret)

    def _delete(self, r: Request, m: re.Match[str]) -> Any:
        with self._lock:
            secret = self.secrets.get(m["name"])
            if secret is None or secret.deleted is not None:
                return self._missing(m["name"])
            secret.deleted = time.time()
        return self._bundle(secret, value=False)

    def _get_deleted(self, r: Request, m: re.Match[str]) -> Any:
        with self._lock:
            secret = self.secrets.get(m["name"])
        if secret is None or secret.deleted is None:
            return Response(404, error_body("SecretNotFound", f"Deleted Secret not found: {m['name']}"))
        return self._bundle(secret, value=False)
