"""A loopback container registry: the read side of the OCI distribution API, over real HTTPS on
127.0.0.1, for tests of what asks a registry whether an image exists (``ddlkit.compute.containers``).

It answers as registries do (the distribution spec, and Docker Hub's and ACR's token flow):

* ``GET /v2/`` and ``HEAD``/``GET /v2/<name>/manifests/<tag or digest>``: ``200`` with the manifest's
  ``Content-Type``, ``Docker-Content-Digest`` and length (``GET`` adds the manifest), ``404`` with
  ``NAME_UNKNOWN`` or ``MANIFEST_UNKNOWN`` (also for a manifest whose type the ``Accept`` header does
  not list, as the spec lets a registry do);
* :attr:`LoopbackRegistry.auth` ``"token"`` (the default): a request without a token is answered
  ``401`` with ``WWW-Authenticate: Bearer realm="https://<it>/token",service=...,scope=repository:<name>:pull``;
  ``GET /token?service=...&scope=...`` gives a token anonymously or with Basic credentials of
  :attr:`LoopbackRegistry.users` (wrong ones: ``401``). As on Docker Hub, a token carries only the
  scopes its holder may have: pull of :attr:`LoopbackRegistry.public` repositories for anyone, of every
  repository for a user; a repository the token does not cover is answered ``401`` with
  ``error="insufficient_scope"``, whether it exists or not. ``"basic"``: ``401`` with
  ``WWW-Authenticate: Basic``, and the users' credentials on every request. ``"none"``: anyone pulls.
  Any other value is sent as the challenge's scheme (``"Negotiate"``), for a client that does not speak it;
* :attr:`LoopbackRegistry.delay_s` delays every answer (a registry too slow for a client's timeout).

Every request is kept in :attr:`LoopbackRegistry.requests` (method, path, the ``Authorization``
scheme only, ``Accept``). The certificate is the caller's (a CA bundle the client trusts) or one made
with the ``openssl`` command (:func:`make_certificate`). Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

__all__ = ["OCI_MANIFEST", "LoopbackRegistry", "RegistryRequest", "make_certificate"]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
SERVICE = "loopback-registry"
_MANIFEST_PATH = re.compile(r"^/v2/(?P<name>[a-z0-9]+(?:[._/-][a-z0-9]+)*)/manifests/(?P<reference>[^/]+)$")


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed CA certificate for ``127.0.0.1`` and ``localhost`` and its key (``registry.crt``,
    ``registry.key`` in ``directory``), made with ``openssl``; the certificate is its own CA bundle."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "registry.crt", directory / "registry.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "7",
            "-subj",
            "/CN=ddlkit loopback registry",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@dataclass(frozen=True)
class RegistryRequest:
    method: str
    path: str
    #: the ``Authorization`` header's scheme (``Bearer``, ``Basic``), never its credential
    auth_scheme: str | None
    accept: str | None


@dataclass
class _Manifest:
    media_type: str
    body: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.body).hexdigest()


@dataclass
class LoopbackRegistry:
    """Started on 127.0.0.1 (a free port) by ``with`` or :meth:`start`; images go in with :meth:`push`."""

    certificate: tuple[Path, Path]
    auth: str = "token"
    #: user name -> password, for the token service and for Basic auth
    users: dict[str, str] = field(default_factory=dict)
    #: repositories anyone may pull (with a token given without credentials)
    public: set[str] = field(default_factory=set)
    delay_s: float = 0.0
    requests: list[RegistryRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._repositories: dict[str, dict[str, _Manifest]] = {}
        self._tokens: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        server = _Server(("127.0.0.1", 0), _handler(self))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*map(str, self.certificate))
        # the handshake in the request's thread: a client that never finishes one holds up only itself
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        threading.Thread(target=server.serve_forever, name="loopback-registry", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def host(self) -> str:
        """``127.0.0.1:<port>``: the registry part of its images' names."""
        assert self._server is not None, "start the registry first"
        return f"127.0.0.1:{self._server.server_address[1]}"

    # ------------------------------------------------------------ content
    def push(self, repository: str, tag: str, *, media_type: str = OCI_MANIFEST) -> str:
        """An image's manifest (of one empty layer) under ``repository:tag``; returns the image's name."""
        config = {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "size": 2,
            "digest": "sha256:" + hashlib.sha256(b"{}").hexdigest(),
        }
        body = json.dumps({"schemaVersion": 2, "mediaType": media_type, "config": config, "layers": []}).encode()
        manifest = _Manifest(media_type, body)
        with self._lock:
            stored = self._repositories.setdefault(repository, {})
            stored[tag] = stored[manifest.digest] = manifest
        return f"{self.host}/{repository}:{tag}"

    def pullable(self, image: str, *, user: str | None = None) -> bool:
        """Whether a node would pull ``image`` from here: one of this registry's, held, and readable
        by ``user`` (None: anonymously) under :attr:`auth`."""
        host, _, rest = image.partition("/")
        name, _, reference = rest.rpartition("@") if "@" in rest else rest.rpartition(":")
        with self._lock:
            held = reference in self._repositories.get(name, {})
        readable = self.auth == "none" or name in self.public or user in self.users
        return host == self.host and held and readable

    # ------------------------------------------------------------ answers
    def answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        url = urlsplit(path)
        authorization = headers.get("authorization", "")
        with self._lock:
            self.requests.append(
                RegistryRequest(method, url.path, authorization.partition(" ")[0] or None, headers.get("accept"))
            )
        if self.delay_s:
            time.sleep(self.delay_s)
        if url.path == "/token" and method == "GET":
            return self._token(authorization, parse_qs(url.query))
        if url.path in ("/v2", "/v2/"):
            denied = self._denied(authorization, None)
            return denied or (200, {"Content-Type": "application/json"}, b"{}")
        found = _MANIFEST_PATH.match(url.path)
        if not found or method not in ("GET", "HEAD"):
            return _error(404, "NOT_FOUND", f"no route for {method} {url.path}")
        name, reference = found["name"], found["reference"]
        denied = self._denied(authorization, name)
        if denied:
            return denied
        with self._lock:
            repository = self._repositories.get(name)
            manifest = repository.get(reference) if repository else None
        if repository is None:
            return _error(404, "NAME_UNKNOWN", f"repository name not known to registry: {name}")
        accepted = {part.split(";")[0].strip() for part in headers.get("accept", "").split(",")}
        if manifest is None or manifest.media_type not in accepted:
            return _error(404, "MANIFEST_UNKNOWN", f"manifest unknown: {name}:{reference}")
        return 200, {"Content-Type": manifest.media_type, "Docker-Content-Digest": manifest.digest}, manifest.body

    def _denied(self, authorization: str, repository: str | None) -> tuple[int, dict[str, str], bytes] | None:
        scheme, _, credential = authorization.partition(" ")
        if self.auth == "none":
            return None
        if self.auth == "basic":
            if scheme.lower() == "basic" and self._user(credential):
                return None
            return _error(
                401, "UNAUTHORIZED", "authentication required", {"WWW-Authenticate": f'Basic realm="{SERVICE}"'}
            )
        if self.auth != "token":
            return _error(401, "UNAUTHORIZED", "authentication required", {"WWW-Authenticate": self.auth})
        with self._lock:
            granted = self._tokens.get(credential) if scheme.lower() == "bearer" else None
        if granted is not None and (repository is None or repository in granted):
            return None
        challenge = f'Bearer realm="https://{self.host}/token",service="{SERVICE}"'
        if repository is not None:
            challenge += f',scope="repository:{repository}:pull"'
        if granted is not None:
            challenge += ',error="insufficient_scope"'
        return _error(401, "UNAUTHORIZED", "authentication required", {"WWW-Authenticate": challenge})

    def _token(self, authorization: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        scheme, _, credential = authorization.partition(" ")
        user = self._user(credential) if scheme.lower() == "basic" else None
        if authorization and user is None:
            return _error(401, "UNAUTHORIZED", "incorrect username or password")
        if query.get("service") != [SERVICE]:
            return _error(400, "INVALID_REQUEST", "service is not this registry's")
        asked = {
            m["name"]
            for scope in query.get("scope", [])
            if (m := re.match(r"repository:(?P<name>[^:]+):", scope)) and "pull" in scope.rsplit(":", 1)[1].split(",")
        }
        with self._lock:
            # as Docker Hub's: a token is given, with only the scopes its holder may have
            granted = asked if user else asked & self.public
            token = secrets.token_urlsafe(24)
            self._tokens[token] = granted
        return (
            200,
            {"Content-Type": "application/json"},
            json.dumps({"token": token, "access_token": token, "expires_in": 300}).encode(),
        )

    def _user(self, credential: str) -> str | None:
        try:
            name, _, password = base64.b64decode(credential).decode().partition(":")
        except ValueError:
            return None
        return name if self.users.get(name) == password else None


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"errors": [{"code": code, "message": message, "detail": None}]}).encode()
    return status, {"Content-Type": "application/json", **(headers or {})}, body


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up or refuses the certificate is the client's test to judge."""


def _handler(registry: LoopbackRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # the request log is the record
            pass

        def _serve(self) -> None:
            status, headers, body = registry.answer(
                self.command, self.path, {k.lower(): v for k, v in self.headers.items()}
            )
            self.send_response(status)
            for name, value in {
                **headers,
                "Docker-Distribution-API-Version": "registry/2.0",
                "Content-Length": str(len(body)),
            }.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = _serve

    return Handler
