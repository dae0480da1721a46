"""The user's own presets and experiments -- in ``./conf``, ``--config-dir``, ``hydra.searchpath``,
``conf/experiment/`` and the experiment directories -- are chosen like built-in options (issue 16),
and a broken experiment file breaks only the commands that select it (issue 17, item 16)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddlkit.launch.cli import main
from ddlkit.testing import FAKES_MODULE

PRESET = "defaults:\n  - local\n\ngrace_period_s: 99\n"
NAMED_PRESET = "name: local\ngrace_period_s: 77\n"
EXPERIMENT = "# @package _global_\ndefaults:\n  - override /compute: patient\n\ntrainer:\n  epochs: 3\n"


@pytest.fixture(autouse=True)
def _fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDLKIT_PLUGINS", FAKES_MODULE)


def conf_dir(root: Path) -> Path:
    (root / "compute").mkdir(parents=True)
    (root / "compute" / "patient.yaml").write_text(PRESET)
    (root / "compute" / "named.yaml").write_text(NAMED_PRESET)
    (root / "experiment").mkdir()
    (root / "experiment" / "quick.yaml").write_text(EXPERIMENT)
    return root


def composed(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main([*args, "framework=fake", "--cfg", "job"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


@pytest.mark.parametrize("where", ["--config-dir", "hydra.searchpath", "./conf"])
def test_presets_and_experiments_are_chosen_like_built_in_options(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = conf_dir(tmp_path / ("conf" if where == "./conf" else "mine"))
    flags = {
        "--config-dir": ["--config-dir", str(root)],
        "hydra.searchpath": [f"hydra.searchpath=[file://{root}]"],
        "./conf": [],
    }[where]
    out = composed(capsys, *flags, "compute=patient")
    assert "compute:\n  grace_period_s: 99.0\n  name: local\n" in out
    # an experiment in conf/experiment/ that overrides a group with the user's own preset
    out = composed(capsys, *flags, "+experiment=quick")
    assert "compute:\n  grace_period_s: 99.0\n  name: local\n" in out and "trainer:\n  epochs: 3\n" in out


@pytest.mark.plugins  # ddlkit --help composes the default config: framework=pytorch
def test_help_lists_the_presets_and_a_typo_is_answered_with_the_same_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf_dir(tmp_path / "conf")
    assert main(["--help"]) == 0
    listed = re.search(r"^compute: (.*)$", capsys.readouterr().out, re.MULTILINE)[1].split(", ")
    assert {"local", "named", "patient"} <= set(listed)
    assert main(["framework=fake", "compute=patinet", "--cfg", "job"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"ddlkit: error: unknown compute target 'patinet' (config key `compute`). Choose one of: "
        f"{', '.join(sorted(listed))}.\n"
    )


def test_a_preset_that_names_its_plugin_gets_the_plugins_schema(tmp_path: Path, run_factory) -> None:
    conf_dir(tmp_path / "conf")
    out = run_factory("compute=named", "data.length=64", "trainer.max_steps=1").assert_success()
    assert '"grace_period_s": 77.0' in (out.job_dir / "job.json").read_text()
    (tmp_path / "conf" / "compute" / "typo.yaml").write_text("name: local\ngrace_period: 5\n")
    out = run_factory("compute=typo").assert_returncode(2)
    assert out.stderr == (
        "ddlkit: error: unknown key `compute.grace_period`: compute has no option grace_period. "
        "Did you mean `compute.grace_period_s`?\n"
    )
    (tmp_path / "conf" / "compute" / "nameless.yaml").write_text("grace_period_s: 5\n")
    out = run_factory("compute=nameless").assert_returncode(2)
    assert out.stderr.startswith("ddlkit: error: the compute preset does not say which compute target it configures")


@pytest.mark.plugins  # ddlkit --help composes the default config: framework=pytorch
def test_a_broken_experiment_breaks_only_the_commands_that_select_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "broken.yaml").write_text("trainer:\n  epochs: [1\n")
    (tmp_path / "experiments" / "fine.yaml").write_text("# @package _global_\ntrainer:\n  epochs: 4\n")
    assert main(["--help"]) == 0
    assert "experiment: broken, fine" in capsys.readouterr().out
    assert "trainer:\n  epochs: 4\n" in composed(capsys, "+experiment=fine")
    assert main(["framework=fake", "+experiment=broken", "--cfg", "job"]) == 2
    assert capsys.readouterr().err == (
        f"ddlkit: error: experiment file {tmp_path}/experiments/broken.yaml is not a valid config: expected ',' or "
        "']', but got '<stream end>' at line 3, column 1\n"
    )


SHIPPED = Path(__file__).resolve().parents[1] / "conf"


def _shipped(path: Path) -> object:
    """``group=name``; a compute preset built on a target other than the core's compute=local (its defaults)
    needs the plugin that registers that target."""
    preset = f"{path.parent.name}={path.stem}"
    builds_on = re.findall(r"^  - (\w+)$", path.read_text(), flags=re.MULTILINE)
    plugin = path.parent.name == "compute" and builds_on != ["local"]
    return pytest.param(preset, id=preset, marks=[pytest.mark.plugins] if plugin else [])


@pytest.mark.parametrize("preset", [_shipped(p) for p in sorted(SHIPPED.glob("*/*.yaml"))])
def test_the_shipped_example_presets_compose(preset: str, capsys: pytest.CaptureFixture[str]) -> None:
    group, _, name = preset.partition("=")
    selection = f"+experiment={name}" if group == "experiment" else preset
    data_root = ["data.root=/data/imagenet"] if group == "experiment" else []
    code = main(["--config-dir", str(SHIPPED), "framework=fake", selection, *data_root, "--cfg", "job"])
    out = capsys.readouterr()
    assert code == 0, out.err
