"""Where credentials come from, and that they never show; no Azure SDK, no emulator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddlkit import ConfigError
from ddlkit.redact import split_secrets
from ddlkit_azure.credentials import Auth, check_tls, resolve
from ddlkit_azure.storage import AzureBlobConfig

URL = "https://acct.blob.core.windows.net"


def test_sas_is_preferred_then_connection_string_then_default_credential(tmp_path: Path) -> None:
    env = {
        "AZURE_STORAGE_SAS_TOKEN": "?sv=1&sig=abc",
        "AZURE_STORAGE_CONNECTION_STRING": "AccountName=a;AccountKey=k",
        "AZURE_STORAGE_ACCOUNT": "acct",
    }
    sas = resolve("auto", env=env)
    assert (sas.kind, sas.secret, sas.account_url) == (Auth.sas, "sv=1&sig=abc", URL)
    del env["AZURE_STORAGE_SAS_TOKEN"]
    assert resolve("auto", env=env).kind is Auth.connection_string
    del env["AZURE_STORAGE_CONNECTION_STRING"]
    default = resolve("auto", env=env)
    assert (default.kind, default.secret) == (Auth.default_credential, None)
    with pytest.raises(ConfigError, match="AZURE_STORAGE_SAS_TOKEN.*preferred"):
        resolve("auto", env={})


def test_secrets_are_read_from_files_and_never_shown(tmp_path: Path) -> None:
    (tmp_path / "sas").write_text("sv=2&sig=SECRETSIG\n")
    cred = resolve("sas", account_url=URL, sas_token_file=str(tmp_path / "sas"), env={})
    assert cred.secret == "sv=2&sig=SECRETSIG"
    assert "SECRETSIG" not in repr(cred) and "SECRETSIG" not in str(cred)
    with pytest.raises(ConfigError, match="cannot read the credential file"):
        resolve("sas", account_url=URL, sas_token_file=str(tmp_path / "missing"), env={})
    with pytest.raises(ConfigError, match="no SAS token"):
        resolve("sas", account_url=URL, env={"AZURE_STORAGE_CONNECTION_STRING": "x"})


@pytest.mark.parametrize("conn", ["garbage", "not;a=connection", ";;"])
def test_a_malformed_connection_string_is_one_line_that_does_not_show_it(
    conn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37, item 11: the SDK's ValueError reached the user from a rank, in a 43-line traceback;
    storage=azure's configure (the launcher, before anything runs) now says it in one line."""
    with pytest.raises(ConfigError) as info:
        resolve("auto", env={"AZURE_STORAGE_CONNECTION_STRING": conn})
    message = str(info.value)
    assert message.startswith("the Azure storage connection string in $AZURE_STORAGE_CONNECTION_STRING is malformed")
    assert conn not in message.replace("connection string", "") and "\n" not in message
    (tmp_path / "conn").write_text(conn)
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_SAS_TOKEN", raising=False)
    from ddlkit_azure.storage import AzureBlobStorage

    backend = AzureBlobStorage(AzureBlobConfig(container="c", connection_string_file=str(tmp_path / "conn")))
    with pytest.raises(ConfigError, match=f"connection string in {tmp_path / 'conn'} is malformed"):
        backend.configure(None)


def test_a_sas_in_the_account_url_is_the_sas_token_and_never_shown() -> None:
    """Issue 17, item 10: ``storage.account_url='https://acct...?sv=..&sig=..'``."""
    url = f"{URL}?sv=2026&se=2030-01-01&sp=racwdl&sig=URLSECRET"
    cred = resolve("auto", account_url=url, env={})
    sas = "sv=2026&se=2030-01-01&sp=racwdl&sig=URLSECRET"
    assert (cred.kind, cred.secret, cred.account_url) == (Auth.sas, sas, URL)
    assert "URLSECRET" not in repr(cred)
    # a token from the environment or a file comes first; the URL still loses its query
    cred = resolve("sas", account_url=url, env={"AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=ENV"})
    assert (cred.secret, cred.account_url) == ("sv=1&sig=ENV", URL)
    # a URL with an ordinary query string is left alone
    assert resolve("default_credential", account_url=f"{URL}?x=1", env={}).account_url == f"{URL}?x=1"
    # and the config's copies hold it without the SAS, the ranks the whole value
    redacted, found = split_secrets({"storage": {"account_url": url}})
    assert (redacted["storage"]["account_url"], found) == (f"{URL}?***", {"storage.account_url": url})


def test_plain_http_only_to_the_local_emulator() -> None:
    assert check_tls("http://127.0.0.1:10000/devstoreaccount1")
    assert check_tls(URL)
    with pytest.raises(ConfigError, match="https"):
        check_tls("http://acct.blob.core.windows.net")


def test_the_config_holds_references_not_secrets() -> None:
    """Fields name where the secret is, so nothing secret reaches config.yaml or job.json; if a user
    nevertheless passes a token on the command line under a secret-looking key, it is redacted."""
    fields = {"sas_token_file": "/run/secrets/sas", "connection_string_file": "/run/secrets/conn", "auth": "sas"}
    redacted, found = split_secrets({"storage": {**vars(AzureBlobConfig(**fields)), "sas_token": "sv=1&sig=x"}})
    assert found == {"storage.sas_token": "sv=1&sig=x"}
    assert redacted["storage"]["sas_token_file"] == "/run/secrets/sas"


def test_the_plugin_imports_no_azure_sdk(tmp_path: Path) -> None:
    code = (
        "import sys, ddlkit_azure.plugin, ddlkit_azure.storage, ddlkit_azure.credentials\n"
        "print(sorted(m for m in sys.modules if m.startswith('azure')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr


@pytest.mark.slow
def test_the_wheel_leaves_the_loopback_services_out(tmp_path: Path) -> None:
    """The stand-ins of Azure's services (ddlkit_azure.testing) are the test suite's: the plugin's wheel
    ships the plugin only (issue 38, item 6), while an editable install still imports them."""
    import zipfile

    plugin = Path(__file__).resolve().parents[1]
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(plugin)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("ddlkit_azure-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ddlkit_azure/storage.py" in names and "ddlkit_azure/azureml.py" in names
    assert not [n for n in names if n.startswith("ddlkit_azure/testing")], names
