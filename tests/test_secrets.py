"""Secrets are never printed and never written (issue 17, items 8-11).

Every entry point that takes a secret is run through the real CLI (fake framework) with marker
values, and every file it leaves (job and sweep directories, rank logs, the jobs index) and its
whole console output are searched for them."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ddlkit import redact
from ddlkit.compute import secret_env
from ddlkit.testing import RunFactory, RunOutcome

#: every marker contains this; none of it may appear anywhere
LEAK = "LEAK"
TOKEN = "sv=2026-01-01&se=2030-01-01&sp=racwdl&sig=LEAKtokenSIG%2Bx"
URL_SAS = "sv=2026-01-01&ss=b&srt=sco&sp=rwdlac&se=2030-01-01T00:00:00Z&st=2026-01-01&sig=LEAKurlSIG%3D"
ACCOUNT = "http://127.0.0.1:10000/devstoreaccount1"
URL = f"{ACCOUNT}?{URL_SAS}"
#: what the ranks must get back: see storage=memory's expect_sha256 (ddlkit.testing.fakes)
EXPECTED = hashlib.sha256(f"{TOKEN}|{URL}".encode()).hexdigest()
SECRET_ARGS = ("storage=memory", f"storage.sas_token='{TOKEN}'", f"storage.account_url='{URL}'")
SMALL = (
    "data.length=64",
    "data.val_length=16",
    "data.num_classes=10",
    "trainer.epochs=1",
    "trainer.batch_size=8",
    "trainer.log_every=2",
)


# ---------------------------------------------------------------------------- the pieces
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (URL, f"{ACCOUNT}?***"),
        (TOKEN, "***"),
        (f"?{TOKEN}", "?***"),
        (
            f"HTTP 403 for {ACCOUNT}/c/blob.bin?{URL_SAS} (retrying)",
            f"HTTP 403 for {ACCOUNT}/c/blob.bin?*** (retrying)",
        ),
        (f"storage.account_url='{URL}'", f"storage.account_url='{ACCOUNT}?***'"),
        (f"storage.account_url={URL}", f"storage.account_url={ACCOUNT}?***"),
        (
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=LEAK+k/ey==;EndpointSuffix=core.windows.net",
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=***;EndpointSuffix=core.windows.net",
        ),
        (
            "BlobEndpoint=https://a.blob.core.windows.net;SharedAccessSignature=sv=1&sig=LEAK",
            "BlobEndpoint=https://a.blob.core.windows.net;SharedAccessSignature=***",
        ),
        # no credential: untouched
        ("https://a.blob.core.windows.net/c?restype=container&comp=list&design=1", None),
        ("data.root=blob://c/imagenet trainer.epochs=2", None),
    ],
)
def test_redact_text_removes_credentials_in_values(text: str, expected: str | None) -> None:
    assert redact.redact_text(text) == (text if expected is None else expected)
    assert redact.has_credentials(text) is (expected is not None)


def test_a_sas_in_any_url_value_is_split_out_and_restored_on_the_ranks() -> None:
    config = {
        "storage": {"name": "azure", "account_url": URL, "container": "c"},
        "data": {"roots": ["blob://c/x", URL], "root": "https://a/c?comp=list"},
    }
    redacted, found = redact.split_secrets(config)
    assert redacted == {
        "storage": {"name": "azure", "account_url": f"{ACCOUNT}?***", "container": "c"},
        "data": {"roots": ["blob://c/x", f"{ACCOUNT}?***"], "root": "https://a/c?comp=list"},
    }
    assert found == {"storage.account_url": URL, "data.roots.1": URL}
    restored = json.loads(json.dumps(redacted))
    secret_env.restore(restored, secret_env.decode(secret_env.encode(found)))
    assert restored == config


def test_redact_overrides_and_override_secrets() -> None:
    argv = [
        "ddlkit",
        f"storage.account_url='{URL}'",
        "logger.wandb.api_key=LEAKkey1,LEAKkey2",
        "+storage.sas_token=\"'LEAKquoted'\"",
        "optimizer.lr=0.1,0.2",
    ]
    assert redact.redact_overrides(argv) == [
        "ddlkit",
        f"storage.account_url='{ACCOUNT}?***'",
        "logger.wandb.api_key=***",
        "+storage.sas_token=***",
        "optimizer.lr=0.1,0.2",
    ]
    values = set(redact.override_secrets(argv).values())
    assert {"LEAKkey1", "LEAKkey2", "LEAKquoted"} <= values
    assert not any("0.1" in v for v in values)


def test_a_redacting_stream_scrubs_what_is_written_and_is_otherwise_the_stream() -> None:
    inner = io.StringIO()
    stream = redact.RedactingStream(inner, redact.override_secrets(["logger.wandb.api_key=LEAKkey"]))
    stream.write("api_key: LEAKkey\n")
    stream.writelines([f"url: {URL}\n"])
    stream.flush()
    assert inner.getvalue() == f"api_key: ***\nurl: {ACCOUNT}?***\n"
    assert stream.getvalue() == inner.getvalue()  # anything else is the wrapped stream's


def test_redact_config_file(tmp_path: Path) -> None:
    path = tmp_path / "multirun.yaml"
    OmegaConf.save(
        OmegaConf.create(
            {
                "hydra": {
                    "overrides": {"task": ["storage.sas_token=LEAKtok", f"storage.account_url='{URL}'"]},
                    "job": {"override_dirname": "storage.sas_token=LEAKtok,trainer.epochs=2"},
                    "sweep": {"dir": "multirun/${now:%H}"},
                },
                "storage": {"sas_token": "LEAKtok", "account_url": URL},
            }
        ),
        path,
    )
    redact.redact_config_file(path)
    text = path.read_text()
    assert LEAK not in text
    saved = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert saved["hydra"]["overrides"]["task"] == ["storage.sas_token=***", f"storage.account_url='{ACCOUNT}?***'"]
    assert saved["hydra"]["job"]["override_dirname"] == "storage.sas_token=***,trainer.epochs=2"
    assert saved["hydra"]["sweep"]["dir"] == "multirun/${now:%H}"  # interpolations kept as they were
    assert saved["storage"] == {"sas_token": "***", "account_url": f"{ACCOUNT}?***"}


# ---------------------------------------------------------------------------- every entry point, end to end
class _Cli:
    def __init__(self, base: Path) -> None:
        self.factory = RunFactory(base)
        self.env = {"DDLKIT_STATE_DIR": str(base / "state")}

    def __call__(self, *args: str, timeout: float = 120.0) -> RunOutcome:
        return self.factory.cli(*args, env=self.env, timeout=timeout)

    def run(self, *overrides: str, job_dir: Path) -> RunOutcome:
        return self.factory(*overrides, job_dir=job_dir, env=self.env)


def _leaks(out: RunOutcome, base: Path) -> list[str]:
    """Where a marker shows: the console, or any file under the test's directory."""
    found = [name for name, text in (("stdout", out.stdout), ("stderr", out.stderr)) if LEAK in text]
    found += [str(p) for p in base.rglob("*") if p.is_file() and LEAK.encode() in p.read_bytes()]
    return found


@pytest.fixture
def cli(tmp_path: Path) -> _Cli:
    return _Cli(tmp_path)


def test_a_run_writes_and_prints_no_secret_and_the_ranks_get_them(cli: _Cli, tmp_path: Path) -> None:
    """Item 10: a SAS in storage.account_url, and a token under a secret key."""
    out = cli.run(*SECRET_ARGS, f"storage.expect_sha256={EXPECTED}", *SMALL, job_dir=tmp_path / "job")
    out.assert_success()
    assert _leaks(out, tmp_path) == []
    job = tmp_path / "job"
    written = json.loads((job / "job.json").read_text())
    assert written["config"]["storage"]["account_url"] == f"{ACCOUNT}?***"
    assert written["secrets"] == ["storage.account_url", "storage.sas_token"]
    assert f"account_url: {ACCOUNT}?***" in (job / "config.yaml").read_text()
    assert f"storage.account_url='{ACCOUNT}?***'" in (job / "overrides.yaml").read_text()
    assert f"storage.account_url='{ACCOUNT}?***'" in json.loads((job / "environment.json").read_text())["argv"]
    assert (job / "rank-0.log").is_file()


def test_the_ranks_check_of_the_restored_secrets_can_fail(cli: _Cli, tmp_path: Path) -> None:
    """The check the previous test relies on: a wrong digest stops the job on its rank."""
    out = cli.run(*SECRET_ARGS, f"storage.expect_sha256={'0' * 64}", *SMALL, job_dir=tmp_path / "job")
    assert out.returncode != 0
    assert "did not get the secrets back" in out.stdout + out.stderr
    assert _leaks(out, tmp_path) == []


@pytest.mark.parametrize(
    "flags", [("--cfg", "job"), ("--cfg", "all"), ("--info", "config"), ("--info", "all"), ("--help",)], ids=" ".join
)
def test_printing_the_config_redacts(cli: _Cli, tmp_path: Path, flags: tuple[str, ...]) -> None:
    """Item 9: ``--cfg``, ``--info`` and ``--help`` print the composed config."""
    out = cli("framework=fake", *SECRET_ARGS, *flags)
    out.assert_success()
    assert _leaks(out, tmp_path) == []
    if flags != ("--help",):  # --help prints the defaults, not the overrides
        assert "sas_token: '***'" in out.stdout or "sas_token: ***" in out.stdout, out.output
        assert f"{ACCOUNT}?***" in out.stdout, out.output


def test_plan_and_a_sweep_redact(cli: _Cli, tmp_path: Path) -> None:
    plan = cli("plan", "-m", "framework=fake", *SECRET_ARGS, *SMALL, "optimizer.lr=0.1,0.05")
    plan.assert_success()
    assert _leaks(plan, tmp_path) == []
    assert f"storage.account_url='\"'\"'{ACCOUNT}?***'\"'\"''" in plan.stdout, plan.output

    sweep_dir = tmp_path / "sweep"
    sweep = cli(
        "-m",
        "framework=fake",
        *SECRET_ARGS,
        f"storage.expect_sha256={EXPECTED}",
        *SMALL,
        "optimizer.lr=0.1,0.05",
        f"hydra.sweep.dir={sweep_dir}",
    )
    sweep.assert_success()
    assert (sweep_dir / "multirun.yaml").is_file() and (sweep_dir / "1" / "rank-0.log").is_file()
    assert _leaks(sweep, tmp_path) == []


def test_a_failed_job_and_its_resume_hint_redact(cli: _Cli, tmp_path: Path) -> None:
    out = cli.run(
        *SECRET_ARGS, *SMALL, "trainer.checkpoint_every=2", "framework.fail_at_step=3", job_dir=tmp_path / "job"
    )
    assert out.returncode not in (0, 2), out.output
    assert "resume with: ddlkit" in out.stderr, out.output
    assert _leaks(out, tmp_path) == []


@pytest.mark.parametrize(
    "args",
    [
        # item 8: the README's example; Hydra would echo the token in its "To append ..." hint
        pytest.param(("storage=local", f"storage.sas_token='{TOKEN}'"), id="item8"),
        pytest.param(("storage=azure", f"storage.sas_token='{TOKEN}'"), id="item8-azure", marks=pytest.mark.plugins),
        # item 11: accepted, ignored, and failing after training
        pytest.param(("storage=azure", f"+storage.sas_token='{TOKEN}'"), id="item11-azure", marks=pytest.mark.plugins),
        pytest.param(("storage=local", f"++storage.sas_token='{TOKEN}'"), id="item11-plusplus"),
        pytest.param(
            ("logger=[console,wandb]", "+logger.wandb.api_token=LEAKkey"),
            id="misspelt-logger-key",
            marks=pytest.mark.plugins,
        ),
    ],
)
def test_a_secret_under_a_key_that_is_no_option_is_refused_unseen(
    cli: _Cli, tmp_path: Path, args: tuple[str, ...]
) -> None:
    out = cli.run(*args, *SMALL, job_dir=tmp_path / "job")
    out.assert_returncode(2)
    assert out.stderr.startswith("ddlkit: error: `"), out.output
    assert "is not an option of" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.output
    assert not (tmp_path / "job").exists()  # refused before anything ran
    assert _leaks(out, tmp_path) == []


def test_hydra_errors_and_argument_errors_redact(cli: _Cli, tmp_path: Path) -> None:
    # a key that is no option (not secret-looking): Hydra's error echoes the whole override
    typo = cli(
        "framework=fake", "storage=memory", f"storage.acount_url='{URL}'", "storage.sas_token=LEAKtok1", "--cfg", "job"
    )
    assert typo.returncode != 0 and "acount_url" in typo.stderr, typo.output
    # a bad value for --info: argparse echoes it
    info = cli("framework=fake", "storage=memory", "--info", "storage.sas_token=LEAKtok2")
    assert info.returncode != 0 and "invalid choice" in info.stderr, info.output
    # a secret for a logger that is not selected
    unselected = cli("framework=fake", "storage=memory", "logger.wandb.api_key=LEAKtok3")
    assert unselected.returncode != 0, unselected.output
    for out in (typo, info, unselected):
        assert _leaks(out, tmp_path) == [], out.output
