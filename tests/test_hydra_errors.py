"""Mistakes Hydra finds are told in the README's one line, exit status 2 (issue 17, items 15 and 19):
unknown keys however they are added, with the closest valid key; wrong types and enum values."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlkit.launch.cli import main
from ddlkit.launch.commandline import hydra_quote
from ddlkit.testing import FAKES_MODULE


@pytest.fixture(autouse=True)
def _fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDLKIT_PLUGINS", FAKES_MODULE)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "trainer.batch_size=abc",
            "`trainer.batch_size=abc` is invalid: 'abc' is not an integer. Give an integer, "
            "e.g. trainer.batch_size=32.",
        ),
        ("trainer.precision=fp8", "`trainer.precision=fp8` is invalid: choose one of fp32, bf16, fp16."),
        (
            "trainer.epochs=null",
            "`trainer.epochs=null` is invalid: trainer.epochs cannot be null. Give it a value, e.g. trainer.epochs=2.",
        ),
        ("data.lenght=3", "unknown key `data.lenght`: data has no option lenght. Did you mean `data.length`?"),
        ("modle=resnet18", "unknown key `modle`: there is no config group or key modle. Did you mean `model`?"),
        (
            "trainer.decay_epochs=[1]",
            "unknown key `trainer.decay_epochs`: trainer has no option decay_epochs. "
            "Did you mean `optimizer.decay_epochs`?",
        ),
        (
            "+trainer.epochs=3",
            "`trainer.epochs` is already in the config: set it without the `+` (trainer.epochs=...).",
        ),
        # every framework's models (the test kit's fake framework adds softmax; the resnets are the framework plugins')
        pytest.param(
            "model=resnet99",
            "unknown model 'resnet99' (config key `model`). Choose one of: custom, resnet101, "
            "resnet152, resnet18, resnet34, resnet50, softmax, swin_b, swin_t, vit_b_16, vit_h_14, vit_l_16.",
            marks=pytest.mark.plugins,
        ),
        ("hydra/sweeper=nevergrad", "hydra/sweeper=nevergrad is not installed: pip install hydra-nevergrad-sweeper"),
    ],
)
def test_one_line_naming_the_problem_and_the_fix(
    override: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["framework=fake", override, "--cfg", "job"]) == 2
    out = capsys.readouterr()
    assert out.err == f"ddlkit: error: {message}\n"
    assert out.out == ""


@pytest.mark.parametrize("override", ["+trainer.batchsize=8", "++trainer.batchsize=8"])
def test_a_key_no_schema_declares_is_refused_however_it_is_added(
    override: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_dir = tmp_path / "job"
    assert main(["framework=fake", override, f"hydra.run.dir={job_dir}"]) == 2
    assert capsys.readouterr().err == (
        "ddlkit: error: unknown key `trainer.batchsize` (`+` cannot add an option): trainer has no option batchsize. "
        "Did you mean `trainer.batch_size`?\n"
    )
    assert not job_dir.exists() or not any(job_dir.iterdir())  # nothing written: no config.yaml with the typo


def test_a_top_level_key_added_with_plus_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["framework=fake", "+tranier.epochs=3", f"hydra.run.dir={tmp_path / 'job'}"]) == 2
    assert capsys.readouterr().err.startswith(
        "ddlkit: error: unknown key `tranier` (`+` cannot add an option): there is no config group or key tranier. "
        "Did you mean `trainer`?"
    )


def test_an_override_hydra_cannot_read_says_how_to_quote(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["framework=fake", "trainer.resume=$(x", "--cfg", "job"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddlkit: error: cannot read the override `trainer.resume=$(x`: ") and err.count("\n") == 1
    assert "\"key='a value'\"" in err


def test_a_range_on_the_basic_sweeper_names_the_sweeper_that_can_search_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-m", "framework=fake", "optimizer.lr=interval(0.01,1)"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddlkit: error: hydra/sweeper=basic lists every combination") and err.count("\n") == 1
    assert "hydra/sweeper=optuna (pip install hydra-optuna-sweeper)" in err


@pytest.mark.parametrize(
    "value", ["/tmp/a b", "/tmp/x $(y; z & w)", "/tmp/it's", "null", "1e5", "/t/${x}", "a,b=c", "runs/r50"]
)
def test_hydra_quote_reads_back_as_the_same_string(value: str) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    parsed = OverridesParser.create().parse_override(f"k={hydra_quote(value)}").value()
    assert OmegaConf.create({"k": str(parsed)}).k == value  # as OmegaConf resolves it: ${ stays literal


@pytest.mark.parametrize(
    ("override", "shown", "option"),
    [
        ("trainer=0", "0", "default"),
        ("dist=nan", "nan", "native"),
        ("compute=null", "null", "local"),
        ("~data=1", "1", "synthetic"),
        ("~dist=[]", "[]", "native"),
        ("trainer=default,0", "0", "default"),
    ],
)
@pytest.mark.parametrize("command", [[], ["plan"]])
def test_a_group_given_no_name_is_one_line(
    command: list[str], override: str, shown: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A number or null for a config group's option reached Hydra's composition: a 50-line
    ValueError traceback, exit 1 (issue 23, item 4)."""
    assert main([*command, "framework=fake", override]) == 2
    group = override.lstrip("~").partition("=")[0]
    err = capsys.readouterr().err
    assert err.startswith(
        f"ddlkit: error: `{override}` is invalid: {group} is a config group, whose option is "
        f"chosen by name, not {shown}. Choose one of: "
    )
    assert option in err.split("Choose one of: ")[1] and err.count("\n") == 1


def test_a_plan_with_a_job_that_does_not_compose_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hydra's sweeper wrote multirun.yaml, then failed to compose the first job, before the
    launcher that removes a plan's files ran (issue 23, item 4)."""
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "framework=fake", "trainer.batch_size=abc,8", "hydra.sweep.dir=."]) == 2
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().err.startswith(
        "ddlkit: error: 1 of 2 sweep job is invalid; no job was started:\n"
        "  job #0 (framework=fake trainer.batch_size=abc): `trainer.batch_size=abc` is invalid"
    )


def test_a_group_only_a_search_path_holds_given_no_name_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "small.yaml").write_text("x: 1\n")
    assert main(["framework=fake", f"hydra.searchpath=[file://{tmp_path}]", "+extra=1", "--cfg", "job"]) == 2
    assert capsys.readouterr().err == (
        "ddlkit: error: a config group's option is chosen by name (Config group override must be a string or a list. "
        "Got int): give its name, quoted if it reads as a number or null (group='0').\n"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "trainer.epochs=" + "9" * 5000,
            "a number on the command line is too long (value has 5000 digits): no setting takes one that big.",
        ),
        pytest.param(
            "model=[resnet18,resnet50]",
            "`model=[resnet18,resnet50]` is invalid: model takes one option, and the "
            "list gives 2. Choose one of: custom, resnet101, resnet152, resnet18, resnet34, resnet50, softmax, "
            "swin_b, swin_t, vit_b_16, vit_h_14, vit_l_16 (model=<name>), or run one job per option with "
            "-m model=<a>,<b>.",
            marks=pytest.mark.plugins,
        ),
        ("trainer.seed=-1", "trainer.seed=-1 is invalid: it must be an integer in [0, 4294967295]."),
        ("dist.timeout_s=inf", "dist.timeout_s=inf is invalid: it must be positive and at most 2147483 (seconds)."),
        (
            f"hydra.run.dir=/tmp/{'x' * 300}",
            f"/tmp/{'x' * 300} is longer than the file system allows for a path or a name "
            "in it: give hydra.run.dir (or hydra.sweep.dir) a shorter one.",
        ),
    ],
)
@pytest.mark.parametrize("command", [[], ["plan"]])
def test_values_that_used_to_end_in_a_traceback_are_one_line(
    override: str, message: str, command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = [] if override.startswith("hydra.run.dir") else [f"hydra.run.dir={tmp_path / 'job'}"]
    assert main([*command, "framework=fake", override, *run_dir]) == 2
    assert capsys.readouterr().err == f"ddlkit: error: {message}\n"
    assert not (tmp_path / "job" / "job.json").exists()


def test_more_threads_than_cores_are_capped_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from ddlkit import threads

    cores = len(os.sched_getaffinity(0))
    assert threads.per_rank(100000, 1) == cores
    assert capsys.readouterr().err == (
        f"ddlkit: warning: framework.num_threads=100000 is more than the {cores} cores "
        f"this rank may use; using {cores}\n"
    )
    assert threads.per_rank(1, 1) == 1 and capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["framework=fake", "storage=[]"],
        ["plan", "framework=fake", "storage=[]"],
        ["framework=fake", "storage=[]", "--cfg", "job"],
    ],
    ids=" ".join,
)
def test_an_empty_list_for_a_group_of_one_option_is_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``storage=[]`` composed a config without storage: ``--cfg job`` printed it, a run said "unknown key"."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "ddlkit: error: `storage=[]` is invalid: storage takes one option, and the list gives none. Choose one of: "
    ), err
    assert "local, local_ssd, memory, nfs" in err and err.endswith(
        " (storage=<name>), or run one job per option with -m storage=<a>,<b>.\n"
    )


def test_a_defaults_list_giving_a_group_several_options_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hydra's 'Merge error: ... is not a subclass of ...' for ``override /model: [a, b]`` in an experiment."""
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "two.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /model: [resnet18, resnet50]\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "framework=fake", "+experiment=two"]) == 2
    assert capsys.readouterr().err == (
        "ddlkit: error: model takes one option, and a config file's defaults list gives it several: choose one, or "
        "run one job per option with -m model=<a>,<b>.\n"
    )
