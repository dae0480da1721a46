"""ddlkit.compute.containers.check_image / ensure_pullable: a registry asked for an image through the OCI
distribution API, over real HTTPS, against the loopback registry (ddlkit.testing.registry); nothing here
leaves the machine."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import ddlkit
from ddlkit.compute._oci import ImageReference
from ddlkit.compute.containers import ImageCheck, Pullable, check_image, ensure_pullable
from ddlkit.testing.registry import LoopbackRegistry, make_certificate

PASSWORD = "registry-password-7c1e"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("registry-tls"))


@pytest.fixture
def registry(certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackRegistry]:
    """Token auth (as Docker Hub's and ACR's), a user, ``team/public`` for anyone; its certificate trusted."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    with LoopbackRegistry(certificate, users={"alice": PASSWORD}, public={"team/public"}) as started:
        yield started


def answer(check: ImageCheck) -> tuple[Pullable, str]:
    return check.answer, check.reason


# ---------------------------------------------------------------------------- image names
@pytest.mark.parametrize(
    ("image", "registry", "repository", "reference", "url"),
    [
        (
            "ubuntu",
            "docker.io",
            "library/ubuntu",
            "latest",
            "https://registry-1.docker.io/v2/library/ubuntu/manifests/latest",
        ),
        (
            "docker.io/ddlkit/pytorch:0.1.0-cuda",
            "docker.io",
            "ddlkit/pytorch",
            "0.1.0-cuda",
            "https://registry-1.docker.io/v2/ddlkit/pytorch/manifests/0.1.0-cuda",
        ),
        (
            "index.docker.io/python:3.11",
            "index.docker.io",
            "library/python",
            "3.11",
            "https://registry-1.docker.io/v2/library/python/manifests/3.11",
        ),
        (
            "myacr.azurecr.io/team/train@sha256:" + "a" * 64,
            "myacr.azurecr.io",
            "team/train",
            "sha256:" + "a" * 64,
            "https://myacr.azurecr.io/v2/team/train/manifests/sha256:" + "a" * 64,
        ),
        ("localhost:5000/train:1", "localhost:5000", "train", "1", "https://localhost:5000/v2/train/manifests/1"),
        ("localhost/train", "localhost", "train", "latest", "https://localhost/v2/train/manifests/latest"),
    ],
)
def test_an_image_name_is_read_as_docker_reads_it(
    image: str, registry: str, repository: str, reference: str, url: str
) -> None:
    ref = ImageReference.parse(image)
    assert (ref.registry, ref.repository, ref.reference, ref.manifest_url) == (registry, repository, reference, url)


# ---------------------------------------------------------------------------- the answers
def test_each_check_takes_the_proxies_the_environment_has_now(
    registry: LoopbackRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy set while an earlier check ran, and gone since, is not used again (urlopen's opener is
    built once per process with the proxies of that moment: a sweep's launcher, a notebook)."""
    import urllib.request

    monkeypatch.setattr(urllib.request, "_opener", None)  # as in a fresh process
    image = registry.push("team/public", "1")
    with socket.socket() as dead:  # a proxy port nothing listens on
        dead.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{dead.getsockname()[1]}")
        assert check_image(image).answer is Pullable.UNKNOWN
    monkeypatch.delenv("HTTPS_PROXY")
    assert answer(check_image(image)) == (Pullable.YES, f"{registry.host} has it")


def test_an_image_anyone_may_pull_is_found_through_an_anonymous_token(registry: LoopbackRegistry) -> None:
    image = registry.push("team/public", "1")
    assert answer(check_image(image)) == (Pullable.YES, f"{registry.host} has it")
    # the manifest HEAD without a token, the token (no credentials), the HEAD with it
    assert [(r.method, r.path, r.auth_scheme) for r in registry.requests] == [
        ("HEAD", "/v2/team/public/manifests/1", None),
        ("GET", "/token", None),
        ("HEAD", "/v2/team/public/manifests/1", "Bearer"),
    ]


def test_a_private_image_needs_the_credentials(registry: LoopbackRegistry) -> None:
    image = registry.push("team/private", "1")
    assert answer(check_image(image)) == (Pullable.DENIED, f"{registry.host} refused it without credentials (401)")
    assert answer(check_image(image, username="alice", password=PASSWORD)) == (Pullable.YES, f"{registry.host} has it")
    assert ("GET", "/token", "Basic") in [(r.method, r.path, r.auth_scheme) for r in registry.requests]
    assert answer(check_image(image, username="alice", password="wrong")) == (
        Pullable.DENIED,
        f"{registry.host} gives no token for the credentials given (401)",
    )


@pytest.mark.parametrize("image", ["team/public:2", "team/nothing:1"])
def test_a_missing_tag_or_repository_is_not_found(registry: LoopbackRegistry, image: str) -> None:
    registry.push("team/public", "1")
    repository, tag = image.split(":")
    assert answer(check_image(f"{registry.host}/{image}", username="alice", password=PASSWORD)) == (
        Pullable.NOT_FOUND,
        f"{registry.host} answered 404 for {repository}:{tag}",
    )


def test_an_image_index_is_found_because_the_check_accepts_it(registry: LoopbackRegistry) -> None:
    """A multi-platform image's manifest is an index: a registry answers 404 to a client that does not take it."""
    image = registry.push("team/public", "multi", media_type="application/vnd.oci.image.index.v1+json")
    assert check_image(image).answer is Pullable.YES
    docker_v2 = "application/vnd.docker.distribution.manifest.v2+json"
    assert check_image(registry.push("team/public", "v2", media_type=docker_v2)).answer is Pullable.YES


def test_basic_auth_is_answered_with_the_credentials(registry: LoopbackRegistry) -> None:
    registry.auth = "basic"
    image = registry.push("team/private", "1")
    assert check_image(image, username="alice", password=PASSWORD).answer is Pullable.YES
    assert answer(check_image(image)) == (Pullable.DENIED, f"{registry.host} asks for credentials (401)")


def test_an_authentication_ddlkit_does_not_speak_cannot_be_checked(registry: LoopbackRegistry) -> None:
    registry.auth = "Negotiate"
    assert answer(check_image(registry.push("team/public", "1"))) == (
        Pullable.UNKNOWN,
        f"{registry.host} asks for an authentication ddlkit does not speak (Negotiate)",
    )


def test_a_registry_too_slow_to_answer_cannot_be_checked(registry: LoopbackRegistry) -> None:
    registry.auth, registry.delay_s = "none", 3.0
    assert answer(check_image(registry.push("team/public", "1"), timeout=0.5)) == (
        Pullable.UNKNOWN,
        f"cannot reach {registry.host}: no answer in time",
    )


def test_an_unreachable_registry_cannot_be_checked(registry: LoopbackRegistry) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once it is closed
    assert answer(check_image(f"127.0.0.1:{port}/team/public:1")) == (
        Pullable.UNKNOWN,
        f"cannot reach 127.0.0.1:{port}: Connection refused",
    )


def test_a_registry_whose_certificate_is_not_trusted_cannot_be_checked(
    registry: LoopbackRegistry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other, _ = make_certificate(tmp_path / "other")
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    check = check_image(registry.push("team/public", "1"))
    assert check.answer is Pullable.UNKNOWN
    assert check.reason.startswith(f"cannot reach {registry.host}: its TLS certificate is not trusted here (")


def test_a_token_service_that_cannot_be_reached_cannot_be_checked(registry: LoopbackRegistry) -> None:
    """The token realm is another host than the registry (Docker Hub's auth.docker.io): here, one that hangs up."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    realm = f"127.0.0.1:{listener.getsockname()[1]}"

    def hang_up() -> None:
        connection, _ = listener.accept()
        connection.close()

    threading.Thread(target=hang_up, daemon=True).start()
    registry.auth = f'Bearer realm="https://{realm}/token",service="elsewhere"'
    try:
        check = check_image(registry.push("team/public", "1"))
    finally:
        listener.close()
    assert check.answer is Pullable.UNKNOWN and check.reason.startswith(f"cannot reach {realm} for a token: ")


# ---------------------------------------------------------------------------- before a job is submitted
def test_an_image_that_does_not_exist_is_one_line_naming_the_fix(registry: LoopbackRegistry) -> None:
    image = f"{registry.host}/ddlkit/pytorch:{ddlkit.__version__}-cuda"
    with pytest.raises(ddlkit.ConfigError) as refused:
        ensure_pullable(image, username="alice", password=PASSWORD)
    assert str(refused.value) == (
        f"image {image} does not exist ({registry.host} answered 404 for ddlkit/pytorch:{ddlkit.__version__}-cuda). "
        f"Build and push it (ddlkit's images: scripts/build_images.sh --registry {registry.host}/ddlkit --push), or "
        "set compute.image to an image that exists."
    )


def test_a_refusal_is_final_only_where_the_nodes_pull_with_the_same_credentials(registry: LoopbackRegistry) -> None:
    image = registry.push("team/private", "1")
    with pytest.raises(
        ddlkit.ConfigError,
        match="^"
        + re.escape(
            f"image {image} cannot be pulled: {registry.host} refused it without credentials (401), so it does "
            "not exist or is private. Build and push it"
        ),
    ):
        ensure_pullable(image)
    said: list[str] = []
    assert ensure_pullable(image, refusal_is_final=False, say=said.append).answer is Pullable.DENIED
    assert said == [
        (
            f"ddlkit: note: could not check that image {image} can be pulled ({registry.host} refused it "
            "without credentials (401)); submitting anyway"
        )
    ]


def test_a_check_that_cannot_be_made_is_said_on_stderr_and_the_job_goes_on(
    registry: LoopbackRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    registry.auth = "Negotiate"
    image = registry.push("team/public", "1")
    assert ensure_pullable(image).answer is Pullable.UNKNOWN
    assert capsys.readouterr().err == (
        f"ddlkit: note: could not check that image {image} can be pulled "
        f"({registry.host} asks for an authentication ddlkit does not speak "
        "(Negotiate)); submitting anyway\n"
    )


def test_the_credentials_are_in_no_answer(registry: LoopbackRegistry, capsys: pytest.CaptureFixture[str]) -> None:
    image = registry.push("team/private", "1")
    reasons = [check_image(image, username="alice", password=password).reason for password in (PASSWORD, "wrong")]
    with pytest.raises(ddlkit.ConfigError) as refused:
        ensure_pullable(image, username="alice", password="wrong")
    said = " ".join([*reasons, str(refused.value), *capsys.readouterr()])
    assert PASSWORD not in said and "wrong" not in said
