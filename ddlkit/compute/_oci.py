"""Asking a registry whether an image exists: the OCI distribution API's manifest ``HEAD``, with the
token flow Docker Hub, Azure Container Registry, GHCR and the like answer a client without a token
with (``401`` + ``WWW-Authenticate: Bearer realm=...,service=...,scope=...``), or Basic auth.

Standard library only: the launcher asks this before it submits, and the core depends on no HTTP
client. Proxies (``HTTPS_PROXY``, ``NO_PROXY``) and the CA bundle (``SSL_CERT_FILE``) come from the
environment as it is at each check, as for any client on the machine. Nothing here writes a credential or
a token anywhere: the answers name the registry and the HTTP status only.
"""

from __future__ import annotations

import base64
import enum
import http.client
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ImageCheck", "ImageReference", "Pullable", "check_image"]

#: what the ``Accept`` of a manifest request lists: a registry may answer 404 for a manifest whose
#: type the client does not take (an image index, for one)
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
#: Docker Hub's names: ``docker.io`` is an image name's registry, its API is on another host
_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")
_DOCKER_HUB_API = "registry-1.docker.io"
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class Pullable(enum.Enum):
    YES = "yes"
    #: the registry has no such repository or tag (404)
    NOT_FOUND = "not found"
    #: the registry refused with the credentials given (or none): no such repository, or a private one
    DENIED = "denied"
    #: the registry could not be asked: unreachable, too slow, or an authentication ddlkit does not speak
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ImageReference:
    """An image name as Docker reads it: ``[registry/]repository[:tag|@digest]``."""

    #: the registry as named (``docker.io`` when the name has none)
    registry: str
    #: ``library/ubuntu``, ``ddlkit/pytorch``
    repository: str
    #: the tag (``latest`` when none is named) or the digest
    reference: str

    @classmethod
    def parse(cls, image: str) -> ImageReference:
        name, _, digest = image.partition("@")
        slash = name.rfind("/")
        colon = name.rfind(":")
        tag = name[colon + 1 :] if colon > slash else ""
        name = name[:colon] if colon > slash else name
        first, _, rest = name.partition("/")
        # a first part with a dot or a port, or localhost, is a registry (Docker's rule)
        if rest and ("." in first or ":" in first or first == "localhost"):
            registry, repository = first, rest
        else:
            registry, repository = "docker.io", name
        if registry in _DOCKER_HUB and "/" not in repository:
            repository = f"library/{repository}"
        return cls(registry, repository, digest or tag or "latest")

    @property
    def api_host(self) -> str:
        return _DOCKER_HUB_API if self.registry in _DOCKER_HUB else self.registry

    @property
    def manifest_url(self) -> str:
        return f"https://{self.api_host}/v2/{self.repository}/manifests/{self.reference}"


@dataclass(frozen=True)
class ImageCheck:
    image: str
    answer: Pullable
    #: why, in a few words (the host and the HTTP status or the network's error); never a credential
    reason: str


def check_image(
    image: str, *, username: str | None = None, password: str | None = None, timeout: float = 10.0
) -> ImageCheck:
    """Whether ``image``'s registry has it, asked as a client that pulls it would: the manifest
    ``HEAD``, with a token from the registry's token service (anonymously, or with Basic
    ``username``/``password``) when it asks for one. Each request waits at most ``timeout`` s."""
    ref = ImageReference.parse(image)
    host = ref.api_host
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    try:
        status, answer = _request("HEAD", ref.manifest_url, headers, timeout)
        if status == 401:
            authorization = _authorization(image, ref, answer.get("www-authenticate", ""), username, password, timeout)
            if isinstance(authorization, ImageCheck):
                return authorization
            status, answer = _request("HEAD", ref.manifest_url, {**headers, "Authorization": authorization}, timeout)
    except (OSError, http.client.HTTPException) as err:  # URLError, timeouts, refusals, TLS, no HTTP
        return ImageCheck(image, Pullable.UNKNOWN, f"cannot reach {host}: {_network_reason(err)}")
    with_what = "with the credentials given" if username else "without credentials"
    if status == 200:
        return ImageCheck(image, Pullable.YES, f"{host} has it")
    if status == 404:
        return ImageCheck(image, Pullable.NOT_FOUND, f"{host} answered 404 for {ref.repository}:{ref.reference}")
    if status in (401, 403):
        return ImageCheck(image, Pullable.DENIED, f"{host} refused it {with_what} ({status})")
    return ImageCheck(image, Pullable.UNKNOWN, f"{host} answered {status}")


def _authorization(
    image: str, ref: ImageReference, challenge: str, username: str | None, password: str | None, timeout: float
) -> str | ImageCheck:
    """The ``Authorization`` header that answers the registry's ``WWW-Authenticate`` challenge,
    or the check's outcome when there is none to give."""
    host = ref.api_host
    scheme, _, params = challenge.strip().partition(" ")
    basic = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode() if username else None
    if scheme.lower() == "basic":
        return basic or ImageCheck(image, Pullable.DENIED, f"{host} asks for credentials (401)")
    if scheme.lower() != "bearer":
        return ImageCheck(
            image,
            Pullable.UNKNOWN,
            f"{host} asks for an authentication ddlkit does not speak ({scheme or 'none named'})",
        )
    asked = dict(_CHALLENGE_PARAM.findall(params))
    realm = asked.get("realm")
    if not realm:
        return ImageCheck(image, Pullable.UNKNOWN, f"{host}'s token challenge names no realm")
    query = {"service": asked.get("service"), "scope": asked.get("scope") or f"repository:{ref.repository}:pull"}
    url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode({k: v for k, v in query.items() if v})
    realm_host = urllib.parse.urlsplit(realm).netloc
    try:
        status, answer = _request("GET", url, {"Authorization": basic} if basic else {}, timeout, body=True)
    except (OSError, http.client.HTTPException) as err:
        return ImageCheck(image, Pullable.UNKNOWN, f"cannot reach {realm_host} for a token: {_network_reason(err)}")
    if status in (401, 403):
        with_what = "the credentials given" if username else "no credentials"
        return ImageCheck(image, Pullable.DENIED, f"{realm_host} gives no token for {with_what} ({status})")
    try:
        token = json.loads(answer["body"]) if status == 200 else {}
    except ValueError:
        token = {}
    bearer = token.get("token") or token.get("access_token") if isinstance(token, dict) else None
    if not bearer:
        return ImageCheck(image, Pullable.UNKNOWN, f"{realm_host} answered {status} without a token")
    return f"Bearer {bearer}"


def _request(
    method: str, url: str, headers: Mapping[str, str], timeout: float, *, body: bool = False
) -> tuple[int, dict[str, str]]:
    """The status and the headers (lower-case names; ``body`` adds the body, as text) of one request;
    an HTTP error status is an answer, not an exception."""
    request = urllib.request.Request(url, method=method, headers=dict(headers))
    try:
        # an opener of its own: urlopen's is built once per process, with the proxies of that moment,
        # which a long-lived launcher (a sweep, a notebook) or a test may have changed since
        response = urllib.request.build_opener().open(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        response = err
    with response:
        answer = {name.lower(): value for name, value in response.headers.items()}
        if body:
            answer["body"] = response.read(1 << 20).decode("utf-8", errors="replace")
        return response.status, answer


def _network_reason(err: OSError | http.client.HTTPException) -> str:
    reason = err.reason if isinstance(err, urllib.error.URLError) else err
    if isinstance(reason, TimeoutError):
        return "no answer in time"
    if isinstance(reason, ssl.SSLCertVerificationError):
        return f"its TLS certificate is not trusted here ({reason.verify_message})"
    return str(getattr(reason, "strerror", None) or reason or type(reason).__name__)
