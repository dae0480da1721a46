"""A loopback HTTPS endpoint for testing the real Azure SDKs without any Azure service.

The Azure SDKs refuse to send a bearer token over plain ``http``, and ``DefaultAzureCredential``
needs a way to sign in. This kit gives a test both, with no test-only code path in the code
under test:

* :func:`make_certificate` -- a self-signed certificate (and key) for ``127.0.0.1`` and
  ``localhost``, which is also its own CA bundle;
* :class:`LoopbackServer` -- a threaded HTTPS server on ``127.0.0.1`` (a free port) with a small
  route table (method + path regex -> handler) and a thread-safe log of every request it got
  (method, path, query, headers without ``Authorization``, the parsed JSON body). A request no
  route matches is answered 404 in Azure's error shape and logged with ``matched=False``; a
  handler that raises is answered 500 and its traceback kept in :attr:`LoopbackServer.errors`;
* :func:`install_az` -- a stand-in ``az`` executable: ``DefaultAzureCredential`` ends in
  ``AzureCliCredential``, which runs ``az account get-access-token --output json --resource R``;
  the stand-in prints a token (an unsigned JWT) and appends its arguments to ``az.log``;
* :class:`InterceptingProxy` -- an HTTP ``CONNECT`` proxy on 127.0.0.1 for the hosts an SDK
  builds from a template and cannot be pointed elsewhere (``https://<account>.blob.core.windows.net``):
  it terminates TLS for the host names it is given, with a certificate the loopback certificate
  signs, and pipes the plain HTTP to a local upstream (Azurite reads the account from the ``Host``
  header). ``CONNECT`` to any other host is refused (403) and logged, so nothing leaves the machine;
* :func:`sdk_environment` -- the environment that makes the real SDKs use both: ``PATH`` with the
  stand-in first, ``REQUESTS_CA_BUNDLE`` / ``SSL_CERT_FILE`` naming the certificate, and
  ``AZURE_TOKEN_CREDENTIALS=AzureCliCredential``, so that ``DefaultAzureCredential`` goes
  straight to the CLI instead of probing the instance metadata service (169.254.169.254) first;
  :data:`CREDENTIAL_ENV` lists the variables to remove, which would make it pick another credential.

Typical use (the plugin's ``tests/conftest.py`` has these as the fixtures ``https_loopback`` and
``azure_cli_login``)::

    cert = make_certificate(tmp_path / "tls")
    with LoopbackServer(cert) as server:
        server.route("GET", r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/.*", lambda req, m: Response(200, {...}))
        env = sdk_environment(cert, install_az(tmp_path / "bin"))
        ...  # the SDK, with os.environ updated by env and CREDENTIAL_ENV removed
        assert server.requests(method="PUT", path=r".*/jobs/.*")[0].body["properties"]["jobType"] == "Command"

Standard library and ``cryptography`` only; nothing here imports an Azure SDK.

Stable API (other tests build on it): :func:`make_certificate`, :class:`Certificate`,
:class:`LoopbackServer` (``url``, ``host``, ``port``, ``route``, ``drop``, ``requests``, ``clear``,
``errors``, ``start``, ``stop``, context manager), :class:`Request`, :class:`Response`,
:func:`error_body`, :class:`InterceptingProxy` (``url``, ``port``, ``connects``, ``start``, ``stop``,
context manager), :func:`install_az`, :data:`EXPIRED_SIGN_IN`, :data:`TOKEN_CLAIMS`, :func:`sdk_environment`,
:data:`CREDENTIAL_ENV`.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import re
import selectors
import socket
import socketserver
import ssl
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = [
    "COUNTING_JOB",
    "CREDENTIAL_ENV",
    "EXPIRED_SIGN_IN",
    "TOKEN_CLAIMS",
    "Certificate",
    "Handler",
    "InterceptingProxy",
    "LoopbackServer",
    "Request",
    "Response",
    "error_body",
    "follow_while_dropping",
    "install_az",
    "make_certificate",
    "sdk_environment",
    "token_claims",
    "unsigned_token",
]

#: variables that make ``DefaultAzureCredential`` use another credential than the CLI (service
#: principal, workload identity, managed identity endpoints): removed where the stand-in ``az`` is used
CREDENTIAL_ENV = (
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
    "AZURE_CLIENT_CERTIFICATE_PATH",
    "AZURE_CLIENT_CERTIFICATE_PASSWORD",
    "AZURE_CLIENT_SEND_CERTIFICATE_CHAIN",
    "AZURE_USERNAME",
    "AZURE_PASSWORD",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_AUTHORITY_HOST",
    "AZURE_POD_IDENTITY_AUTHORITY_HOST",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "IDENTITY_SERVER_THUMBPRINT",
    "MSI_ENDPOINT",
    "MSI_SECRET",
    "IMDS_ENDPOINT",
    "AZURE_TOKEN_CREDENTIALS",
)
#: the claims of the stand-in's token (a user of a made-up tenant)
TOKEN_CLAIMS = {
    "aud": "https://management.azure.com",
    "iss": "https://sts.windows.net/00000000-0000-0000-0000-00000000000a/",
    "tid": "00000000-0000-0000-0000-00000000000a",
    "oid": "00000000-0000-0000-0000-0000000000b1",
    "upn": "tester@example.invalid",
    "name": "ddlkit tester",
}
#: request headers never logged (the bearer token)
_UNLOGGED_HEADERS = frozenset({"authorization"})


# ---------------------------------------------------------------------------- certificate
@dataclass(frozen=True)
class Certificate:
    """PEM files: the server's certificate (also the CA bundle clients trust) and its key."""

    cert_file: Path
    key_file: Path

    @property
    def ca_bundle(self) -> Path:
        return self.cert_file


def make_certificate(directory: Path, *, days: int = 7) -> Certificate:
    """A self-signed certificate for ``127.0.0.1`` and ``localhost`` (a CA certificate, so that
    OpenSSL accepts it as its own issuer), written to ``directory/loopback.{crt,key}``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ddlkit loopback")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "loopback.crt", directory / "loopback.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_file.chmod(0o600)
    return Certificate(cert_file, key_file)


# ---------------------------------------------------------------------------- requests and routes
@dataclass(frozen=True)
class Request:
    """One request the server got, as logged."""

    method: str
    #: the path, percent-decoded, without the query
    path: str
    #: ``parse_qs`` of the query string: ``{"api-version": ["2024-04-01"]}``
    query: dict[str, list[str]]
    #: every header but ``Authorization``; names lower-cased
    headers: dict[str, str]
    #: the body parsed as JSON; None when empty or not JSON (then see :attr:`data`)
    body: Any
    data: bytes = b""
    #: the scheme of the Authorization header ("Bearer"), None without one (the token itself is not kept)
    auth_scheme: str | None = None
    #: whether a route answered it (False: the server answered 404 for want of one)
    matched: bool = True
    time: float = 0.0
    #: whether the server closed the connection without answering it (:meth:`LoopbackServer.drop`)
    dropped: bool = False
    #: the ``oid`` claim of its bearer token (:func:`token_claims`): who called, None without one
    principal: str | None = None

    def param(self, name: str, default: str | None = None) -> str | None:
        """The first value of query parameter ``name``."""
        values = self.query.get(name)
        return values[0] if values else default


@dataclass
class Response:
    """What a handler returns: ``body`` is sent as JSON unless it is ``bytes`` or ``str``."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


#: ``handler(request, match)`` -> :class:`Response` (or a JSON-able body, answered 200)
Handler = Callable[[Request, "re.Match[str]"], "Response | Any"]


#: a job's code for :func:`follow_while_dropping`: 40 lines ``line N`` 0.15 s apart, then ``the end``
COUNTING_JOB = (
    "import time\nfor i in range(40):\n    print(f'line {i}', flush=True)\n    time.sleep(0.15)\nprint('the end')"
)


def follow_while_dropping(logs: Any, server: LoopbackServer, pattern: str) -> str:
    """Follow a job of :data:`COUNTING_JOB` (``logs``: its handle's ``logs(follow=True)``) while its log
    reads (GETs whose path matches ``pattern``) are dropped: the next 2 after ``line 1`` (retried:
    nothing may be lost or repeated), every one after ``line 12`` (the reads give up: the following
    ends, the job does not). What was followed, its lines checked to be consecutive from ``line 0``."""
    text, dropped = "", []
    for chunk in logs:
        text += chunk
        if "line 1\n" in text and not dropped:
            server.drop("GET", pattern, times=2)
            dropped.append(2)
        if "line 12\n" in text and dropped == [2]:
            server.drop("GET", pattern, times=None)
            dropped.append(None)
    lines = [ln for ln in text.splitlines() if ln.startswith("line ")]
    assert lines == [f"line {i}" for i in range(len(lines))] and len(lines) >= 13, text
    assert "the end" not in text and dropped == [2, None], text
    return text


def error_body(code: str, message: str) -> dict[str, Any]:
    """Azure's error response shape (ARM and the data planes), which the SDKs turn into exceptions."""
    return {"error": {"code": code, "message": message}}


class _Serving:
    """A socket server run in a daemon thread: ``start``/``stop``, or a ``with`` block."""

    _server: Any = None
    _thread: threading.Thread | None = None

    def _make_server(self) -> Any:
        raise NotImplementedError

    @property
    def port(self) -> int:
        assert self._server is not None, f"the {type(self).__name__} is not started"
        return self._server.server_address[1]

    def start(self) -> Self:
        self._server = self._make_server()
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"{type(self).__name__}-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LoopbackServer(_Serving):
    """A threaded HTTPS server on 127.0.0.1 answering from a route table; every request is logged.

    Routes are tried newest first, so a test can override a default route by adding another."""

    def __init__(self, certificate: Certificate, *, host: str = "127.0.0.1", tls: bool = True) -> None:
        self.certificate = certificate
        self.host = host
        #: False: plain HTTP, for an upstream of an :class:`InterceptingProxy` (which terminates TLS)
        self.tls = tls
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self._log: list[Request] = []
        self._lock = threading.Lock()
        #: tracebacks of handlers that raised (answered 500): a test should assert it is empty
        self.errors: list[str] = []
        self._drops: list[list[Any]] = []

    # ------------------------------------------------------------ routes
    def route(self, method: str, pattern: str, handler: Handler | None = None) -> Any:
        """Answer ``method`` (``"*"``: any) requests whose whole path matches ``pattern`` with
        ``handler``; without ``handler``, a decorator."""

        def add(fn: Handler) -> Handler:
            with self._lock:
                self._routes.insert(0, (method.upper(), re.compile(pattern), fn))
            return fn

        return add if handler is None else add(handler)

    # ------------------------------------------------------------ faults
    def drop(self, method: str, pattern: str, times: int | None = 1) -> None:
        """Close the connection without answering the next ``times`` requests (None: every one
        from now on) of ``method`` (``"*"``: any) whose whole path matches ``pattern``, as a server
        or a proxy that goes away mid-request does: the client reads no status line (the SDKs'
        ``ServiceResponseError``). Each is logged with ``dropped=True``. A refused connection is
        :meth:`stop`."""
        with self._lock:
            self._drops.append([method.upper(), re.compile(pattern), times])

    def _dropping(self, method: str, path: str) -> bool:
        with self._lock:
            for drop in self._drops:
                m, pattern, left = drop
                if m in (method, "*") and pattern.fullmatch(path) and (left is None or left > 0):
                    if left is not None:
                        drop[2] = left - 1
                    return True
        return False

    def _find(self, method: str, path: str) -> tuple[Handler, re.Match[str]] | None:
        with self._lock:
            routes = list(self._routes)
        for m, pattern, handler in routes:
            if m in (method, "*") and (match := pattern.fullmatch(path)):
                return handler, match
        return None

    # ------------------------------------------------------------ the log
    def requests(self, method: str | None = None, path: str | None = None) -> list[Request]:
        """The requests so far (a copy), oldest first; only ``method`` ones and those whose path
        matches the regex ``path`` (whole path), if given."""
        with self._lock:
            log = list(self._log)
        pattern = re.compile(path) if path else None
        return [
            r
            for r in log
            if (method is None or r.method == method.upper()) and (pattern is None or pattern.fullmatch(r.path))
        ]

    def clear(self) -> None:
        """Forget the requests logged so far."""
        with self._lock:
            self._log.clear()

    def _record(self, request: Request) -> None:
        with self._lock:
            self._log.append(request)

    # ------------------------------------------------------------ serving
    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>`` (no trailing slash; ``http://`` without TLS)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def _make_server(self) -> ThreadingHTTPServer:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificate.cert_file, self.certificate.key_file)
        httpd = _Server((self.host, 0), _make_handler(self))
        if self.tls:
            httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        return httpd


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    # a client that hangs up mid-handshake is no test failure
    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError)):
            super().handle_error(request, client_address)


def _make_handler(server: LoopbackServer) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: one TLS handshake per client connection

        def log_message(self, format: str, *args: Any) -> None:  # the request log is the record
            pass

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else b""
            try:
                body = json.loads(data) if data else None
            except ValueError:
                body = None
            auth = self.headers.get("Authorization")
            request = Request(
                method=self.command,
                path=unquote(parts.path),
                query=parse_qs(parts.query, keep_blank_values=True),
                headers={k.lower(): v for k, v in self.headers.items() if k.lower() not in _UNLOGGED_HEADERS},
                body=body,
                data=data,
                auth_scheme=auth.split(" ", 1)[0] if auth else None,
                time=time.time(),
                principal=token_claims(auth.split(" ", 1)[-1]).get("oid") if auth else None,
            )
            if server._dropping(self.command, request.path):
                server._record(_replace(request, dropped=True))
                self.close_connection = True  # no status line: the connection just closes
                return
            found = server._find(self.command, request.path)
            if found is None:
                server._record(_replace(request, matched=False))
                missing = f"no loopback route for {self.command} {request.path}"
                self._send(Response(404, error_body("NotFound", missing)))
                return
            server._record(request)
            handler, match = found
            try:
                answer = handler(request, match)
            except Exception:
                server.errors.append(f"{self.command} {request.path}\n{traceback.format_exc()}")
                answer = Response(500, error_body("InternalServerError", "the loopback handler raised"))
            self._send(answer if isinstance(answer, Response) else Response(200, answer))

        def _send(self, response: Response) -> None:
            body = response.body
            headers = {k.lower(): v for k, v in response.headers.items()}
            if body is None:
                payload = b""
            elif isinstance(body, bytes):
                payload = body
                headers.setdefault("content-type", "application/octet-stream")
            elif isinstance(body, str):
                payload = body.encode()
                headers.setdefault("content-type", "text/plain; charset=utf-8")
            else:
                payload = json.dumps(body).encode()
                headers.setdefault("content-type", "application/json; charset=utf-8")
            self.send_response(response.status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("x-ms-request-id", f"loopback-{time.monotonic_ns()}")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = do_HEAD = _serve

    return _Handler


def _replace(request: Request, **changes: Any) -> Request:
    from dataclasses import replace

    return replace(request, **changes)


# ---------------------------------------------------------------------------- intercepting proxy
class InterceptingProxy(_Serving):
    """An HTTP ``CONNECT`` proxy on 127.0.0.1 (set ``HTTPS_PROXY`` to :attr:`url`) that answers
    ``CONNECT host:443`` for a host matching one of ``upstreams`` (a regex, whole host name ->
    ``(address, port)`` of a plain-HTTP server on this machine): it terminates TLS with a
    certificate for that host signed by ``certificate`` (which clients trust as their CA bundle)
    and pipes the bytes to the upstream unchanged, ``Host`` header included. A ``CONNECT`` to any
    other host is answered 403. Every ``CONNECT`` is logged in :attr:`connects` as ``(host, allowed)``."""

    def __init__(self, certificate: Certificate, upstreams: Mapping[str, tuple[str, int]]) -> None:
        self.certificate = certificate
        self.upstreams = [(re.compile(pattern), address) for pattern, address in upstreams.items()]
        self.connects: list[tuple[str, bool]] = []
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _make_server(self) -> _ProxyServer:
        server = _ProxyServer(("127.0.0.1", 0), _ProxyHandler)
        server.proxy = self
        return server

    def upstream(self, host: str) -> tuple[str, int] | None:
        allowed = next((address for pattern, address in self.upstreams if pattern.fullmatch(host)), None)
        with self._lock:
            self.connects.append((host, allowed is not None))
        return allowed

    def context(self, host: str) -> ssl.SSLContext:
        """A server context with a certificate for ``host``, signed by the loopback certificate."""
        with self._lock:
            if host not in self._contexts:
                directory = self.certificate.cert_file.parent / "hosts"
                cert_file, key_file = _sign_leaf(self.certificate, host, directory)
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(cert_file, key_file)
                self._contexts[host] = context
            return self._contexts[host]


def _sign_leaf(ca: Certificate, host: str, directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_cert = x509.load_pem_x509_certificate(ca.cert_file.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key_file.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(ca_cert.not_valid_after_utc)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / f"{host}.crt", directory / f"{host}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_file.chmod(0o600)
    return cert_file, key_file


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: InterceptingProxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError)):
            super().handle_error(request, client_address)


class _ProxyHandler(socketserver.BaseRequestHandler):
    server: _ProxyServer

    def handle(self) -> None:
        client: socket.socket = self.request
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
        method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        host, _, port = target.rpartition(":")
        upstream = self.server.proxy.upstream(host) if method == "CONNECT" and port == "443" else None
        if upstream is None:
            client.sendall(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            return
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        with (
            self.server.proxy.context(host).wrap_socket(client, server_side=True) as tls,
            socket.create_connection(upstream, timeout=30) as plain,
        ):
            _pipe(tls, plain)


def _pipe(tls: ssl.SSLSocket, plain: socket.socket) -> None:
    """Bytes both ways until either side closes; one thread, so the TLS socket is never used
    from two threads at once (OpenSSL does not allow that)."""
    with selectors.DefaultSelector() as sel:
        sel.register(tls, selectors.EVENT_READ, plain)
        sel.register(plain, selectors.EVENT_READ, tls)
        while True:
            ready = [key for key, _ in sel.select(timeout=60)]
            if not ready:
                return
            for key in ready:
                source: socket.socket = key.fileobj  # type: ignore[assignment]
                while True:
                    data = source.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
                    # a TLS record may hold more than one recv returned: drain it before selecting again
                    if not (isinstance(source, ssl.SSLSocket) and source.pending()):
                        break


# ---------------------------------------------------------------------------- signing in
def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned_token(claims: Mapping[str, Any], expires: int) -> str:
    """An unsigned JWT of ``claims`` expiring at ``expires`` (epoch seconds): what the stand-ins'
    credentials hand out and the loopback services read the caller from."""
    return ".".join(
        [
            _b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode()),
            _b64url(json.dumps({**claims, "exp": expires, "iat": int(time.time())}).encode()),
            _b64url(b"loopback"),
        ]
    )


def token_claims(token: str) -> dict[str, Any]:
    """The claims of a token :func:`unsigned_token` made ({} for anything else)."""
    try:
        payload = token.split(".")[1]
        return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))
    except (IndexError, ValueError):
        return {}


def install_az(
    bin_dir: Path, *, claims: Mapping[str, Any] | None = None, lifetime_s: int = 24 * 3600, error: str | None = None
) -> Path:
    """Write a stand-in ``az`` into ``bin_dir`` (created) and return ``bin_dir``.

    ``az account get-access-token ...`` prints a token the way the Azure CLI does (``accessToken``,
    ``expiresOn``, ``expires_on``, ``subscription``, ``tenant``, ``tokenType``); the token is an
    unsigned JWT of ``claims`` (default :data:`TOKEN_CLAIMS`), valid for ``lifetime_s`` from now.
    Every call appends its arguments as one line to ``bin_dir/az.log``. Any other ``az`` command
    exits 2, as the CLI does for a command it does not know. ``error``: what the CLI prints to
    stderr instead of a token, exiting 1 (:data:`EXPIRED_SIGN_IN`: a sign-in that has expired)."""
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    expires = int(time.time()) + lifetime_s
    all_claims = {**TOKEN_CLAIMS, **(claims or {})}
    token = unsigned_token(all_claims, expires)
    answer = json.dumps(
        {
            "accessToken": token,
            "expiresOn": dt.datetime.fromtimestamp(expires).strftime("%Y-%m-%d %H:%M:%S.%f"),
            "expires_on": expires,
            "subscription": "00000000-0000-0000-0000-0000000000c1",
            "tenant": all_claims["tid"],
            "tokenType": "Bearer",
        },
        indent=2,
    )
    failing = f"cat >&2 <<'EOF'\n{error}\nEOF\nexit 1\n" if error is not None else ""
    script = bin_dir / "az"
    script.write_text(
        f"""#!/bin/sh
# A stand-in for the Azure CLI (ddlkit_azure.testing.loopback): answers `az account get-access-token` only.
echo "$*" >> "{bin_dir / "az.log"}"
if [ "$1 $2" = "account get-access-token" ]; then
{failing}cat <<'EOF'
{answer}
EOF
exit 0
fi
echo "ERROR: the loopback stand-in for az only answers 'az account get-access-token'" >&2
exit 2
""",
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


#: what the Azure CLI prints when its sign-in has expired (Microsoft Entra's answer to its refresh token)
EXPIRED_SIGN_IN = (
    "ERROR: AADSTS700082: The refresh token has expired due to inactivity. The token was issued on "
    "2026-05-01T09:12:44.0000000Z and was inactive for 90.00:00:00. Trace ID: 0000 Correlation ID: 0000 "
    "Timestamp: 2026-11-28 10:00:00Z\nInteractive authentication is needed. Please run:\n"
    "az login --scope https://management.core.windows.net//.default"
)


def sdk_environment(
    certificate: Certificate | None = None,
    az_bin: Path | None = None,
    base: Mapping[str, str] | None = None,
    *,
    proxy: InterceptingProxy | None = None,
) -> dict[str, str]:
    """The variables to set so the real Azure SDKs trust ``certificate``, sign in with the
    stand-in ``az`` in ``az_bin`` and reach the hosts ``proxy`` intercepts through it (each may be
    None). ``base``: the environment whose ``PATH`` is extended (default ``os.environ``). Also
    remove :data:`CREDENTIAL_ENV` (except what this sets)."""
    base = os.environ if base is None else base
    env: dict[str, str] = {}
    if certificate is not None:
        env["REQUESTS_CA_BUNDLE"] = env["SSL_CERT_FILE"] = str(certificate.ca_bundle)
    if proxy is not None:
        # the proxy for https only, and never for this machine (the loopback server itself)
        env["HTTPS_PROXY"] = env["https_proxy"] = proxy.url
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    if az_bin is not None:
        env["PATH"] = os.pathsep.join([str(az_bin), base.get("PATH", os.defpath)])
        # DefaultAzureCredential straight to AzureCliCredential: no managed-identity probe of
        # 169.254.169.254, so nothing leaves this machine (an azure-identity setting, not ddlkit's)
        env["AZURE_TOKEN_CREDENTIALS"] = "AzureCliCredential"
    return env
