"""The loopback HTTPS kit: real TLS, real clients, a real DefaultAzureCredential sign-in."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import urllib.request
from pathlib import Path

import certifi
import pytest
import requests

from ddlkit_azure.testing import ACCOUNT, ACCOUNT_KEY, Azurite
from ddlkit_azure.testing.loopback import (
    InterceptingProxy,
    LoopbackServer,
    Response,
    error_body,
    sdk_environment,
)


def test_routes_answer_and_every_request_is_logged(https_loopback: LoopbackServer) -> None:
    https_loopback.route(
        "PUT", r"/things/(?P<name>[^/]+)", lambda req, m: Response(201, {"name": m["name"], "got": req.body})
    )
    https_loopback.route("GET", r"/things/.*", lambda req, m: {"old": True})
    https_loopback.route("GET", r"/things/new", lambda req, m: {"new": True})  # newest route first

    put = requests.put(
        f"{https_loopback.url}/things/a%20b?api-version=1&x=",
        json={"k": [1, 2]},
        headers={"Authorization": "Bearer very-secret-token", "x-ms-test": "yes"},
    )
    assert (put.status_code, put.json()) == (201, {"name": "a b", "got": {"k": [1, 2]}})
    assert requests.get(f"{https_loopback.url}/things/new").json() == {"new": True}
    assert requests.get(f"{https_loopback.url}/things/old").json() == {"old": True}
    missing = requests.delete(f"{https_loopback.url}/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NotFound"

    log = https_loopback.requests()
    assert [(r.method, r.path, r.matched) for r in log] == [
        ("PUT", "/things/a b", True),
        ("GET", "/things/new", True),
        ("GET", "/things/old", True),
        ("DELETE", "/nowhere", False),
    ]
    first = log[0]
    assert first.query == {"api-version": ["1"], "x": [""]} and first.param("api-version") == "1"
    assert first.body == {"k": [1, 2]} and first.headers["x-ms-test"] == "yes"
    assert first.auth_scheme == "Bearer" and "authorization" not in first.headers
    assert "very-secret-token" not in repr(log)
    assert [r.path for r in https_loopback.requests("GET", r"/things/n.*")] == ["/things/new"]
    https_loopback.clear()
    assert https_loopback.requests() == []


def test_a_handler_that_raises_is_a_500_and_is_kept(https_loopback: LoopbackServer) -> None:
    def broken(req, m):
        raise RuntimeError("handler bug")

    https_loopback.route("GET", "/broken", broken)
    assert requests.get(f"{https_loopback.url}/broken").status_code == 500
    assert "handler bug" in https_loopback.errors[0]
    https_loopback.errors.clear()  # the fixture fails a test that leaves errors behind


def test_the_certificate_is_trusted_only_where_it_is_the_ca_bundle(https_loopback: LoopbackServer) -> None:
    https_loopback.route("GET", "/", lambda req, m: Response(200, "hello"))
    with pytest.raises(requests.exceptions.SSLError):  # the public CAs do not vouch for it
        requests.get(f"{https_loopback.url}/", verify=certifi.where())
    context = ssl.create_default_context(cafile=str(https_loopback.certificate.ca_bundle))
    for host in ("127.0.0.1", "localhost"):
        url = f"https://{host}:{https_loopback.port}/"
        assert urllib.request.urlopen(url, context=context).read() == b"hello"


def test_default_azure_credential_signs_in_through_the_stand_in_az(azure_cli_login: Path) -> None:
    from azure.identity import DefaultAzureCredential

    token = DefaultAzureCredential().get_token("https://management.azure.com/.default")
    claims = json.loads(base64.urlsafe_b64decode(token.token.split(".")[1] + "=="))
    assert claims["oid"] and token.expires_on > 0
    calls = (azure_cli_login / "az.log").read_text().splitlines()
    assert calls == ["account get-access-token --output json --resource https://management.azure.com"]
    other = subprocess.run(["az", "group", "list"], capture_output=True, text=True, check=False)
    assert other.returncode == 2


def test_an_sdk_sends_its_token_to_the_loopback_over_tls(
    https_loopback: LoopbackServer,
    azure_cli_login: Path,
) -> None:
    from azure.core import PipelineClient
    from azure.core.pipeline.policies import BearerTokenCredentialPolicy, RetryPolicy
    from azure.core.pipeline.transport import HttpRequest
    from azure.identity import DefaultAzureCredential

    https_loopback.route("GET", "/probe", lambda req, m: Response(403, error_body("AuthorizationFailed", "no")))
    policy = BearerTokenCredentialPolicy(DefaultAzureCredential(), "https://management.azure.com/.default")
    client = PipelineClient(https_loopback.url, policies=[policy, RetryPolicy(retry_total=0)])
    response = client.send_request(HttpRequest("GET", f"{https_loopback.url}/probe"))
    assert response.status_code == 403
    (probe,) = https_loopback.requests("GET", "/probe")
    assert probe.auth_scheme == "Bearer"


def test_the_proxy_carries_a_templated_host_to_azurite_and_refuses_any_other(
    https_loopback: LoopbackServer, azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    from azure.storage.blob import BlobServiceClient

    host = f"{ACCOUNT}.blob.core.windows.net"
    routes = {host.replace(".", r"\."): ("127.0.0.1", azurite.port)}
    with InterceptingProxy(https_loopback.certificate, routes) as proxy:
        for name, value in sdk_environment(https_loopback.certificate, proxy=proxy).items():
            monkeypatch.setenv(name, value)
        service = BlobServiceClient(f"https://{host}", credential={"account_name": ACCOUNT, "account_key": ACCOUNT_KEY})
        container = service.get_container_client("proxied")
        container.create_container()
        container.upload_blob("a/b.bin", b"x" * 300_000)  # more than one TLS record each way
        assert container.download_blob("a/b.bin").readall() == b"x" * 300_000
        # Azurite really holds it (read directly, not through the proxy)
        direct = BlobServiceClient.from_connection_string(azurite.connection_string)
        assert [b.name for b in direct.get_container_client("proxied").list_blobs()] == ["a/b.bin"]
        with pytest.raises(requests.exceptions.ProxyError):
            requests.get("https://management.azure.com/", timeout=10)
        assert ("management.azure.com", False) in proxy.connects
        assert {h for h, allowed in proxy.connects if allowed} == {host}
        # the loopback server itself is never proxied
        https_loopback.route("GET", "/direct", lambda req, m: {"ok": True})
        assert requests.get(f"{https_loopback.url}/direct", timeout=10).json() == {"ok": True}
