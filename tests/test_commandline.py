"""Every command ddlkit prints reproduces its job exactly: the config's sources (``--config-dir``,
``--config-name``) go with it (issue 16), and values keep Hydra's quoting (issue 17, item 18)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ddlkit.launch.commandline import hydra_quote
from ddlkit.testing import FAKES_MODULE, RunFactory

pytestmark = pytest.mark.slow


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a printed command as a user pastes it into a shell."""
    env = {**os.environ, "DDLKIT_PLUGINS": FAKES_MODULE}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_resume_command_of_a_job_in_an_awkward_directory_resumes_it(run_factory: RunFactory) -> None:
    job_dir = run_factory.base_dir / "runs" / "a b $(touch pwned; echo x) & c"
    conf = run_factory.base_dir / "my conf"
    (conf / "compute").mkdir(parents=True)
    (conf / "compute" / "patient.yaml").write_text("defaults:\n  - local\n\ngrace_period_s: 99\n")
    out = run_factory.cli(
        "--config-dir",
        str(conf),
        "framework=fake",
        "compute=patient",
        "data.length=640",
        "trainer.checkpoint_every=2",
        "framework.fail_at_step=3",
        f"hydra.run.dir={hydra_quote(str(job_dir))}",
    ).assert_returncode(1)
    command = re.search(r"resume with: (.*)$", out.stderr, re.MULTILINE)[1]
    assert f"--config-dir '{conf}'" in command
    # the same job again, now without the failure: it resumes from its checkpoint, in its directory
    resumed = shell(f"{command} framework.fail_at_step=0 trainer.max_steps=4", run_factory.base_dir)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads((job_dir / "result.json").read_text())
    assert (result["resumed_from_step"], result["steps"]) == (2, 4)
    assert '"grace_period_s": 99.0' in (job_dir / "job.json").read_text()  # still the preset of --config-dir
    assert not (run_factory.base_dir / "pwned").exists()


def test_plan_prints_commands_that_compose_from_the_same_config_dir_and_name(run_factory: RunFactory) -> None:
    conf = run_factory.base_dir / "conf-elsewhere"
    conf.mkdir()
    (conf / "mycfg.yaml").write_text("defaults:\n  - config\n  - _self_\n\ntrainer:\n  log_every: 3\n")
    out = run_factory.cli(
        "plan", "-cd", str(conf), "-cn", "mycfg", "-m", "framework=fake", "data.length=64", "trainer.seed=1,2"
    ).assert_success()
    commands = re.findall(r"^      command: (.*)$", out.stdout, re.MULTILINE)
    assert len(commands) == 2 and all(f"--config-dir {conf} --config-name mycfg " in c for c in commands)
    ran = shell(commands[1], run_factory.base_dir)
    assert ran.returncode == 0, ran.stderr
    job_dir = Path(re.search(r"hydra.run.dir=(\S+)$", commands[1])[1])
    config = (job_dir / "config.yaml").read_text()
    assert "  log_every: 3\n" in config and "  seed: 2\n" in config  # mycfg's value, and the job's own
