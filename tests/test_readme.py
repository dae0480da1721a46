"""The README's command examples do what it says (issue 22, item 6): a reader copies them.

* Transcripts (``$ ddlkit ...`` followed by ``ddlkit: error: ...``): each command is run and must
  print that line (a line ending in ``...`` is a prefix of the real one) and exit 2; a line
  ``... X`` shows an error a rank reports: X must be in the job's output. The commands run in a
  directory holding the ``my_pkg`` the README's examples import.
* Every other ``ddlkit`` command in a code block is planned (``ddlkit plan``: composed and validated
  as the real run would be, nothing run), with its line continuations joined and its comment
  dropped; it must be valid.

An example that cannot run here names why in :data:`NOT_HERE` (placeholders the reader fills in,
a cluster or a dataset this machine lacks): such an entry is checked to still be in the README, so
the list cannot rot.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddlkit.launch.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"

#: examples (by their first words) that cannot run on this machine, and why
NOT_HERE = {
    "ddlkit data prepare": "needs the raw ImageNet files",
    "ddlkit data manifest": "needs a prepared dataset",
    "ddlkit data upload": "needs a prepared dataset and a storage account",
    "ddlkit jobs": "needs a submitted job (tests/jobs runs these commands on real jobs)",
    "ddlkit compute down": "deletes cloud resources",
    "ddlkit plugins": "lists the plugins installed (tests/test_plugins.py)",
}


@dataclass(frozen=True)
class Example:
    line: int
    command: str
    #: the output a transcript shows (``ddlkit: error: ...``), or None for a command to plan
    expected: str | None = None
    #: ``NAME=value`` before the command (``DDLKIT_PLUGINS=ddlkit.testing.fakes ddlkit ...``)
    env: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return f"README.md:{self.line}: {self.command}"


def _examples() -> list[Example]:
    lines = README.read_text().splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        text = lines[i].strip() if lines[i].startswith("    ") else ""
        start = i
        i += 1
        transcript = text.startswith("$ ")
        env = []
        while (m := re.match(r"([A-Z_]+)=(\S+) ", text.removeprefix("$ "))) is not None:
            env.append(m.groups())
            text = text.replace(m.group(0), "", 1)
        if not text.removeprefix("$ ").startswith("ddlkit "):
            continue
        command = text.removeprefix("$ ")
        while command.endswith("\\") and i < len(lines):  # a command continued on the next line
            command = command[:-1].rstrip() + " " + lines[i].strip()
            i += 1
        command = _without_comment(command)
        if transcript:
            shown = lines[i].strip() if i < len(lines) else ""
            expected = shown if shown.startswith(("ddlkit: error: ", "... ")) else ""
            found.append(Example(start + 1, command, expected=expected, env=tuple(env)))
        else:
            found.append(Example(start + 1, command, env=tuple(env)))
    return found


def _without_comment(command: str) -> str:
    """``ddlkit x=1   # what it does`` -> ``ddlkit x=1`` (a ``#`` inside quotes stays)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    words = list(lexer)
    return shlex.join(words)


def _not_here(example: Example) -> str | None:
    for prefix, why in NOT_HERE.items():
        if example.command.startswith(prefix):
            return why
    if re.search(r"\.\.\.|<[a-z]+>|\b[A-Z]{1,3}\b(?==|$)", example.command):
        return "has placeholders for the reader to fill in"
    return None


EXAMPLES = _examples()


def test_the_readme_has_examples_to_check() -> None:
    """The parser finds the README's examples: a broken parser would check nothing."""
    assert len([e for e in EXAMPLES if e.expected]) >= 5
    assert len([e for e in EXAMPLES if not e.expected and not _not_here(e)]) >= 15


def test_every_not_here_entry_is_still_in_the_readme() -> None:
    for prefix in NOT_HERE:
        assert any(e.command.startswith(prefix) for e in EXAMPLES), f"no README example starts with {prefix!r}"


#: the user's package the README's bring-your-own examples import
MY_PKG_NETS = """
def build_unet(depth=4):
    import torch

    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(1000))


def keras_unet():
    import keras

    inputs = keras.Input((32, 32, 3))
    return keras.Model(inputs, keras.layers.Dense(1000)(keras.layers.Flatten()(inputs)))
"""

MY_PKG_CBS = """
class PrintLr:
    def on_step_end(self, run, step, metrics):
        print(step, metrics["lr"])
"""


@pytest.fixture(autouse=True)
def _as_in_the_readme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command runs in the test's own directory (see conftest) as from the repository's root:
    with its experiments, and with ``my_pkg.nets`` beside it."""
    monkeypatch.setenv("DDLKIT_EXPERIMENTS", str(README.parent / "experiments"))
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "nets.py").write_text(MY_PKG_NETS)
    (tmp_path / "my_pkg" / "cbs.py").write_text(MY_PKG_CBS)


def _needs(example: Example) -> object:
    """An example, marked as needing Horovod (scripts/install_horovod.sh) where it runs dist=horovod."""
    return pytest.param(example, marks=[pytest.mark.extras] if "dist=horovod" in example.command else [])


# the README's examples are written for the full installation: framework=pytorch by default, the first-party
# plugins' compute targets, storage and loggers
@pytest.mark.plugins
@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.expected is not None], ids=str)
def test_a_transcript_prints_what_the_readme_shows(
    example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert example.expected, f"{example}: the line after it shows no `ddlkit: error:` output"
    monkeypatch.setattr(os, "environ", {**os.environ, **dict(example.env)})
    args = shlex.split(example.command)[1:]
    expected = example.expected
    if expected.startswith("... "):  # a rank's error, in the job's output
        code = main(
            [
                *args,
                "data.image_size=32",
                "data.length=8",
                "data.val_length=0",
                "trainer.batch_size=4",
                f"hydra.run.dir={tmp_path / 'job'}",
            ]
        )
        out = capsys.readouterr()
        assert expected.removeprefix("... ").removesuffix("...").rstrip() in out.out + out.err, f"{example}\n{out}"
    else:
        code = main(args)
        err = capsys.readouterr().err.strip()
        if expected.endswith("..."):
            assert err.startswith(expected.removesuffix("...").rstrip()), f"{example}\n  printed: {err}"
        else:
            assert err == expected, f"{example}\n  printed: {err}"
    assert code == 2


@pytest.mark.plugins  # as above
@pytest.mark.parametrize("example", [_needs(e) for e in EXAMPLES if e.expected is None], ids=str)
def test_a_command_is_valid_as_written(example: Example, capsys: pytest.CaptureFixture[str]) -> None:
    if why := _not_here(example):
        pytest.skip(why)
    args = [a for a in shlex.split(example.command)[1:] if a != "--detach"]  # plan what it would submit
    if args and args[0] == "plan":
        args = args[1:]
    code = main(args if {"--cfg", "--help"} & set(args) else ["plan", *args])
    out = capsys.readouterr()
    assert code == 0, f"{example}\n{out.err}"
