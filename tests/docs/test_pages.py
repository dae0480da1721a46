"""The site's generated pages (docs/_gen, run by docs/gen_pages.py at build time) say everything the code
declares: every option of every group with its comment, every result field, every registered component a
how-to page, every benchmark result a page. No mkdocs needed: the pages are generated here as the build
generates them."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ddlkit import result
from ddlkit.config import CORE_SCHEMAS
from ddlkit.launch.cli import SUBCOMMANDS, main
from ddlkit.registry import HOOK_POINTS

ROOT = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(ROOT / "docs"))
try:
    import _gen
    from _gen import benchmarks, options, results, sdk, source
finally:
    sys.path.remove(str(ROOT / "docs"))


def _fields(schema: type, prefix: str) -> Iterator[str]:
    for f in dataclasses.fields(schema):
        if f.name == "name":
            continue
        yield f"{prefix}.{f.name}"
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            yield from _fields(f.default_factory, f"{prefix}.{f.name}")


def test_a_field_comment_is_the_comment_lines_above_it() -> None:
    from ddlkit.config import TrainerConfig
    from ddlkit.optim import AdamWConfig, OptimizerConfig

    assert source.field_comment(TrainerConfig, "batch_size") == (
        "images per rank per step; the global batch is batch_size x world size"
    )
    # a subclass that changes a default keeps its base's words; its own comment wins where it has one
    assert source.field_comment(AdamWConfig, "lr") == source.field_comment(OptimizerConfig, "lr") != ""
    assert source.field_comment(AdamWConfig, "scale_lr").startswith("Adam's steps follow the square root")


def test_a_docstring_keeps_its_lines_and_loses_sphinx_roles() -> None:
    text = "A :class:`~ddlkit.Run` and :mod:`ddlkit.optim`, ``x``.\nExample::\n\n    ddlkit a=1\n"
    assert source.markdown(text).splitlines() == [
        "A `Run` and `ddlkit.optim`, ``x``.",
        "Example:",
        "",
        "    ddlkit a=1",
    ]


@pytest.mark.plugins
def test_the_options_reference_has_every_option_of_every_group() -> None:
    page = options.options_page()
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', page))
    expected = {key for group, schema in CORE_SCHEMAS.items() for key in _fields(schema, group)}
    reg = options.installed().registry
    for group in HOOK_POINTS:
        for name in reg.names(group):
            expected.add(options.section_anchor(group, name))
            schema = reg.get(group, name).config
            if schema is not None:
                expected |= set(_fields(schema, options.section_anchor(group, name)))
    assert expected - anchors == set()
    assert "compute=slurm" in page and "a positive integer" in page  # a name and a rule's words


@pytest.mark.plugins
def test_a_how_to_page_per_component_and_each_in_the_nav() -> None:
    pages = options.howto_pages()
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def paths(node: object) -> Iterator[str]:
        if isinstance(node, list):
            for item in node:
                yield from paths(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from paths(value)
        elif isinstance(node, str):
            yield node

    in_nav = {p for p in paths(nav) if re.fullmatch(r"how-to/(compute|storage|framework|data|logger)/\w+\.md", p)}
    assert set(pages) == in_nav, "mkdocs.yml's nav and the registered components differ"
    assert pages["how-to/compute/local_mpi.md"] == ["compute=local_mpi", "compute=mpi"]  # one module, one page
    howto = _gen.howto()
    slurm = howto["how-to/compute/slurm.md"]
    assert slurm.startswith("# compute=slurm\n")
    assert "pip install -e ./plugins/ddlkit-slurm" in slurm
    assert "](../../reference/options.md#compute-slurm.nodes)" in slurm
    assert "pip install -e './plugins/ddlkit-azure[azureml]'" in howto["how-to/compute/azureml.md"]
    assert "built into ddlkit" in howto["how-to/compute/local.md"]


@pytest.mark.plugins
def test_every_generated_page_shows_the_docstrings_its_commands_are_checked_in() -> None:
    """tests/docs/test_commands.py checks the generated pages' commands in these docstrings (to name the line to
    fix): each is on its page, whole."""
    pages = {**_gen.howto(), "reference/sdk.md": sdk.page()}
    found = _gen.sources()
    assert len({path for path, _ in found}) == len(options.howto_pages()) + 1
    for path, doc in found:
        assert doc.text in pages[path], f"{path}: {doc.path}:{doc.line}"


def test_every_result_field_is_described_in_the_code() -> None:
    comments = source.element_comments(result, "FIELDS")
    assert len(comments) == len(result.FIELDS)
    assert [f.name for f, c in zip(result.FIELDS, comments, strict=True) if not c] == []
    page = results.page()
    for f in result.FIELDS:
        assert f">{f.name}</code> |" in page
    assert ">EXIT_PREEMPTED</code> | `75` |" in page and "## The job directory" in page


@pytest.mark.plugins
def test_the_sdk_page_covers_the_public_modules() -> None:
    import ddlkit

    modules = sdk.public_modules()
    assert modules[0] == "ddlkit"
    # what tests/test_public_api.py holds public
    assert {
        "ddlkit.optim",
        "ddlkit.options",
        "ddlkit.custom",
        "ddlkit.jobdir",
        "ddlkit.result",
        "ddlkit.testing",
        "ddlkit.testing.contracts",
    } <= set(modules)
    page = sdk.page()
    for name in ddlkit.__all__:
        assert f"### ddlkit.{name}\n" in page
    assert "### ddlkit_compute_targets\n" in page and "def ddlkit_step_end(run: RunContext, step: int" in page


def test_every_benchmark_result_has_a_dated_page() -> None:
    pages = benchmarks.pages()
    files = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert files
    for path in files:
        page = pages[f"benchmarks/{path.stem}.md"]
        assert re.search(r"Measured: \*\*\d{4}-\d\d-\d\d\*\* on .*CPUs", page), page[:300]
        assert pages[f"benchmarks/{path.stem}.json"] == path.read_bytes()
        assert f"[{path.stem}]({path.stem}.md)" in pages["benchmarks/index.md"]
        if path.with_suffix(".png").is_file():
            assert f"![{path.stem}]({path.stem}.png)" in page
    overhead = pages["benchmarks/overhead_pytorch.md"]
    assert "| `ratio` |" in overhead
    assert benchmarks.ratios(json.loads((ROOT / "benchmarks/results/overhead_pytorch.json").read_text()))


@pytest.mark.parametrize(
    "subcommand",
    [pytest.param(s, marks=[pytest.mark.plugins] if s == "plan" else []) for s in SUBCOMMANDS if s != "plugins"],
)  # plan composes: framework=pytorch
def test_every_subcommand_takes_help(subcommand: str, capsys: pytest.CaptureFixture[str]) -> None:
    """reference/cli.md shows each subcommand's --help, as ``ddlkit --help`` promises (``ddlkit plan --help``
    was "unrecognized arguments: hydra.launcher.dry_run=true")."""
    try:
        code = main([subcommand, "--help"])
    except SystemExit as exc:  # argparse's --help
        code = exc.code
    out = capsys.readouterr()
    assert code in (0, None), out.err
    assert "usage" in out.out.lower()
