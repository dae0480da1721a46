"""Every command and config in the documentation does what it says (issue 22, item 6; issue 39): a
reader copies them. Read: the pages under docs/, the docstrings the generated pages show (the how-to
pages' module docstrings and the SDK's public modules', named by their source file and line, where a
fix goes), and README.md. Test ids are ``file:line: command``.

Code blocks: indented blocks (README's style) and fenced ones. A fenced block is read as shell when
its language is bash, sh, shell, console, shell-session or zsh, or it has none; ``text`` and any other
language are not read (output, Python, TOML...).

* Transcripts (``$ ddlkit ...`` followed by ``ddlkit: error: ...``): each command is run and must
  print that line (a line ending in ``...`` is a prefix of the real one) and exit 2; a line
  ``... X`` shows an error a rank reports: X must be in the job's output. In a block with ``$ ``
  lines, the other lines are output, never commands. The commands run in a directory holding the
  ``my_pkg`` the examples import.
* Every other ``ddlkit`` command in a code block is planned (``ddlkit plan``: composed and validated
  as the real run would be, nothing run), with its line continuations joined and its comment
  dropped; it must be valid.
* A config file: a code block (indented, fenced ``yaml``/``yml``, or fenced without a language)
  whose first line is a comment naming its file below ``conf/`` or ``experiments/``, optionally
  followed by the command that uses it::

      # conf/compute/mycluster.yaml               ddlkit compute=mycluster dist=native
      defaults:
        - local_mpi
      nodes: 2

  is written at that path (each command of the page runs where the page's config files are, so a
  later ``ddlkit compute=mycluster`` finds its preset) and planned with its command: the one on its
  first line, else what its path selects (``conf/<group>/<name>.yaml``: ``<group>=<name>``;
  ``conf/experiment/<name>.yaml`` or ``experiments/<name>.yaml``: ``+experiment=<name>``;
  ``conf/<name>.yaml``: ``--config-name <name>``). Hydra composes it onto the schemas and the
  options' rules check it, as for a real run. YAML without that first line is not a config of
  ddlkit's (a CI file, a result, an excerpt) and is not checked.

An example that cannot run here names why in :data:`NOT_HERE` (placeholders the reader fills in,
a cluster or a dataset this machine lacks): such an entry is checked to still be in the docs, so
the list cannot rot.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddlkit.launch.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = "README.md"
#: why the generated pages' docstrings could not be read (a plugin missing)
NOT_READ: list[str] = []

#: examples (by their first words) that cannot run on this machine, and why
NOT_HERE = {
    "ddlkit data prepare": "needs the raw ImageNet files",
    "ddlkit data manifest": "needs a prepared dataset",
    "ddlkit data upload": "needs a prepared dataset and a storage account",
    "ddlkit jobs": "needs a submitted job (tests/jobs runs these commands on real jobs)",
    "ddlkit compute down": "deletes cloud resources",
    "ddlkit plugins": "lists the plugins installed (tests/test_plugins.py)",
}

#: fenced blocks of these languages are shell ("": no language, as an indented block)
SHELL = {"", "bash", "sh", "shell", "console", "shell-session", "zsh"}
#: a config file's first line: ``# conf/compute/x.yaml`` or ``# experiments/x.yaml``, maybe a command after it
CONFIG_LINE = re.compile(r"^#\s*((?:conf|experiments)/[\w./-]+\.ya?ml)\b\s*(.*)$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    """A code block of a document: its language ("" for an indented block), the file line of its
    first content line, and its lines (the block's indentation removed)."""

    lang: str
    line: int
    lines: tuple[str, ...]
    fenced: bool = False


def blocks(text: str) -> Iterator[Block]:
    """The code blocks of Markdown ``text`` (line numbers from 1)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if m := _FENCE.match(lines[i]):
            indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence[0] * len(fence)):
                body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i].lstrip())
                i += 1
            i += 1
            yield Block(lang, start + 1, tuple(body), fenced=True)
        elif lines[i].startswith(("    ", "\t")) and lines[i].strip():
            start, body = i, []
            while i < len(lines) and (lines[i].startswith(("    ", "\t")) or not lines[i].strip()):
                if not lines[i].strip() and not (i + 1 < len(lines) and lines[i + 1].startswith(("    ", "\t"))):
                    break  # a blank line ends the block unless it goes on after it
                body.append(lines[i][4:] if lines[i].startswith("    ") else lines[i][1:])
                i += 1
            yield Block("", start + 1, tuple(body))
        else:
            i += 1


@dataclass(frozen=True)
class Source:
    """A document whose code blocks are checked: its name in test ids, the file line of its text's
    first line, and its text."""

    name: str
    offset: int
    text: str


def sources() -> list[Source]:
    found = [Source(README, 1, (ROOT / README).read_text(encoding="utf-8"))]
    for path in sorted(DOCS.rglob("*.md")):
        if "_gen" not in path.relative_to(DOCS).parts:
            found.append(Source(path.relative_to(ROOT).as_posix(), 1, path.read_text(encoding="utf-8")))
    sys.path.insert(0, str(DOCS))
    try:
        from _gen import sources as generated  # the docstrings the generated pages show
    finally:
        sys.path.remove(str(DOCS))
    try:
        docs = generated()
    except RuntimeError as err:  # a first-party plugin is not installed: the core's tier collects this file too
        NOT_READ.append(str(err))
        return found
    seen: set[tuple[str, int]] = set()
    for _, doc in docs:
        if (doc.path, doc.line) not in seen:
            seen.add((doc.path, doc.line))
            found.append(Source(doc.path, doc.line, doc.text))
    return found


@dataclass(frozen=True)
class Example:
    source: str
    line: int
    command: str
    #: the output a transcript shows (``ddlkit: error: ...``), or None for a command to plan
    expected: str | None = None
    #: ``NAME=value`` before the command (``DDLKIT_PLUGINS=ddlkit.testing.fakes ddlkit ...``)
    env: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.command}"


@dataclass(frozen=True)
class Config:
    """A config file a page shows, at ``path`` below the directory its page's commands run in."""

    source: str
    line: int
    path: str
    text: str
    command: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.path}"


def _commands(source: Source, block: Block) -> Iterator[Example]:
    lines = [line.strip() for line in block.lines]
    transcript = any(line.startswith("$ ") for line in lines)
    i = 0
    while i < len(lines):
        text, start = lines[i], i
        i += 1
        if transcript and not text.startswith("$ "):
            continue  # a transcript's output
        text = text.removeprefix("$ ")
        env = []
        while (m := re.match(r"([A-Z_]+)=(\S+) ", text)) is not None:
            env.append(m.groups())
            text = text.replace(m.group(0), "", 1)
        if not text.startswith("ddlkit "):
            continue
        command = text
        while command.endswith("\\") and i < len(lines):  # a command continued on the next line
            command = command[:-1].rstrip() + " " + lines[i]
            i += 1
        command = _without_comment(command)
        line = source.offset + block.line - 1 + start
        if transcript:
            shown = lines[i] if i < len(lines) else ""
            expected = shown if shown.startswith(("ddlkit: error: ", "... ")) else ""
            yield Example(source.name, line, command, expected=expected, env=tuple(env))
        else:
            yield Example(source.name, line, command, env=tuple(env))


def _without_comment(command: str) -> str:
    """``ddlkit x=1   # what it does`` -> ``ddlkit x=1`` (a ``#`` inside quotes stays)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return shlex.join(list(lexer))


def _config(source: Source, block: Block) -> Config | None:
    body = list(block.lines)
    while body and not body[0].strip():
        body.pop(0)
    m = CONFIG_LINE.match(body[0].strip()) if body else None
    if m is None or block.lang not in ("", "yaml", "yml"):
        return None
    path, command = m.group(1), _without_comment(m.group(2)) if m.group(2).startswith("ddlkit ") else ""
    if not command:
        parts = Path(path).with_suffix("").parts
        if parts[0] == "experiments" or parts[1:2] == ("experiment",):
            command = f"ddlkit +experiment={parts[-1]}"
        elif len(parts) == 3:
            command = f"ddlkit {parts[1]}={parts[2]}"
        else:
            command = f"ddlkit --config-name {parts[-1]}"
    return Config(source.name, source.offset + block.line - 1, path, "\n".join(body) + "\n", command)


def _collect() -> tuple[list[Example], list[Config]]:
    examples: list[Example] = []
    configs: list[Config] = []
    for source in sources():
        for block in blocks(source.text):
            config = _config(source, block)
            if config is not None:
                configs.append(config)
            elif block.lang in SHELL:
                examples.extend(_commands(source, block))
    return examples, configs


EXAMPLES, CONFIGS = _collect()


def _not_here(command: str) -> str | None:
    for prefix, why in NOT_HERE.items():
        if command.startswith(prefix):
            return why
    if re.search(r"\.\.\.|<[a-z_]+>|\b[A-Z]{1,3}\b(?==|$)", command):
        return "has placeholders for the reader to fill in"
    return None


def test_the_docs_have_examples_to_check() -> None:
    """The parser finds the examples: a broken parser would check nothing. The README alone has
    its transcripts and commands (a newcomer's first hour)."""
    readme = [e for e in EXAMPLES if e.source == README]
    assert len([e for e in readme if e.expected]) >= 5
    assert len([e for e in readme if not e.expected and not _not_here(e.command)]) >= 15
    assert len([e for e in EXAMPLES if e.expected]) >= 3
    assert len([e for e in EXAMPLES if not e.expected and not _not_here(e.command)]) >= 15
    assert any(e.source.startswith("docs/") for e in EXAMPLES)
    assert CONFIGS, "no config file (a block whose first line is `# conf/<group>/<name>.yaml`) found"


@pytest.mark.plugins
def test_the_generated_pages_docstrings_are_read() -> None:
    """With every first-party plugin installed, the how-to pages' docstrings are among the sources."""
    assert not NOT_READ, NOT_READ
    assert any(e.source.startswith(("ddlkit/", "plugins/")) for e in EXAMPLES)


@pytest.mark.plugins  # some entries are in the plugins' how-to docstrings (ddlkit compute down: ddlkit-azure's)
def test_every_not_here_entry_is_still_in_the_docs() -> None:
    for prefix in NOT_HERE:
        assert any(e.command.startswith(prefix) for e in EXAMPLES), f"no example starts with {prefix!r}"


def test_the_parser_reads_fenced_and_indented_blocks() -> None:
    text = (
        "intro\n\n    ddlkit a=1 \\\n      b=2   # both\n\n```console\n$ ddlkit x=1\nddlkit: error: bad\n"
        "ddlkit plan: output, not a command\n```\n\n```text\nddlkit not=read\n```\n\n"
        "```yaml\n# conf/compute/two.yaml   ddlkit compute=two\ndefaults:\n  - local\n```\n"
    )
    source = Source("t.md", 1, text)
    found = [e for b in blocks(text) if b.lang in SHELL and not _config(source, b) for e in _commands(source, b)]
    assert [(e.line, e.command, e.expected) for e in found] == [
        (3, "ddlkit a=1 b=2", None),
        (7, "ddlkit x=1", "ddlkit: error: bad"),
    ]
    configs = [c for b in blocks(text) if (c := _config(source, b))]
    assert [(c.line, c.path, c.command) for c in configs] == [(17, "conf/compute/two.yaml", "ddlkit compute=two")]


#: the user's package the examples of bringing your own code import
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


@pytest.fixture
def as_in_the_docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each command runs in the test's own directory (see conftest) as from the repository's root:
    with its experiments, and with ``my_pkg.nets`` beside it."""
    monkeypatch.setenv("DDLKIT_EXPERIMENTS", str(ROOT / "experiments"))
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "nets.py").write_text(MY_PKG_NETS)
    (tmp_path / "my_pkg" / "cbs.py").write_text(MY_PKG_CBS)
    return tmp_path


def _with_configs_of(source: str, where: Path) -> None:
    """The config files ``source`` shows, written where its commands run."""
    for config in CONFIGS:
        if config.source == source:
            (where / config.path).parent.mkdir(parents=True, exist_ok=True)
            (where / config.path).write_text(config.text)


def _needs(example: Example | Config) -> object:
    """An example, marked as needing Horovod (scripts/install_horovod.sh) where it runs dist=horovod."""
    return pytest.param(example, marks=[pytest.mark.extras] if "dist=horovod" in example.command else [])


def _plan(command: str, what: object, capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for a in shlex.split(command)[1:] if a != "--detach"]  # plan what it would submit
    if args and args[0] == "plan":
        args = args[1:]
    code = main(args if {"--cfg", "--help"} & set(args) else ["plan", *args])
    out = capsys.readouterr()
    assert code == 0, f"{what}\n{out.err}"


# the examples are written for the full installation: framework=pytorch by default, the first-party
# plugins' compute targets, storage and loggers
@pytest.mark.plugins
@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.expected is not None], ids=str)
def test_a_transcript_prints_what_the_docs_show(
    example: Example, as_in_the_docs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert example.expected, f"{example}: the line after it shows no `ddlkit: error:` output"
    _with_configs_of(example.source, as_in_the_docs)
    for name, value in example.env:
        monkeypatch.setenv(name, value)
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
                f"hydra.run.dir={as_in_the_docs / 'job'}",
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
def test_a_command_is_valid_as_written(
    example: Example, as_in_the_docs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if why := _not_here(example.command):
        pytest.skip(why)
    _with_configs_of(example.source, as_in_the_docs)
    for name, value in example.env:
        monkeypatch.setenv(name, value)
    _plan(example.command, example, capsys)


@pytest.mark.plugins  # as above
@pytest.mark.parametrize("config", [_needs(c) for c in CONFIGS], ids=str)
def test_a_config_file_is_valid(config: Config, as_in_the_docs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if why := _not_here(config.command):
        pytest.skip(why)
    _with_configs_of(config.source, as_in_the_docs)
    _plan(config.command, config, capsys)
