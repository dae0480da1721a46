"""reference/cli.md: the ``ddlkit`` command and its subcommands, with the help each prints (run for
real, in an empty directory, when the site is built)."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from ddlkit.launch import cli

from .source import first_paragraph, markdown

#: the width the help is wrapped to (argparse and rich read COLUMNS)
COLUMNS = "100"


def _environment(home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDLKIT_", "HYDRA_"))}
    env.update(COLUMNS=COLUMNS, NO_COLOR="1", TERM="dumb", DDLKIT_STATE_DIR=os.path.join(home, "state"))
    env.pop("FORCE_COLOR", None)
    return env


def run(commands: list[list[str]], columns: str = COLUMNS) -> dict[tuple[str, ...], str]:
    """Each ``ddlkit`` command line's output (``python -m ddlkit``, this interpreter), run in an empty
    directory; a command that fails is an error: the page would show its error."""
    with tempfile.TemporaryDirectory(prefix="ddlkit-docs-cli-") as tmp:
        env = {**_environment(tmp), "COLUMNS": columns}

        def one(args: list[str]) -> tuple[tuple[str, ...], str]:
            proc = subprocess.run(
                [sys.executable, "-m", "ddlkit", *args], cwd=tmp, env=env, capture_output=True, text=True, timeout=300
            )
            if proc.returncode != 0:
                raise RuntimeError(f"`ddlkit {' '.join(args)}` exited {proc.returncode}: {proc.stderr.strip()}")
            return tuple(args), proc.stdout.rstrip().replace(tmp, "<tmp>")

        with ThreadPoolExecutor(max_workers=4) as pool:
            return dict(pool.map(one, commands))


def _choices(help_text: str) -> list[str]:
    """The subcommands an argparse usage line offers: ``{list,status,...}``."""
    m = re.search(r"\{([a-z,_-]+)\}", help_text)
    return m.group(1).split(",") if m else []


def _block(text: str) -> str:
    return f"```text\n{text}\n```\n"


def page() -> str:
    subcommands = list(cli.SUBCOMMANDS)
    first = run([["--help"]] + [[s, "--help"] for s in subcommands if s != "plugins"])
    first.update(run([["plugins"]], columns="160"))  # its table, wide enough for the names unbroken
    nested = [[s, c, "--help"] for s in subcommands if s != "plugins" for c in _choices(first[(s, "--help")])]
    second = run(nested)
    out = [
        "# Command line",
        "",
        markdown("\n\n".join(inspect.cleandoc(cli.__doc__ or "").split("\n\n")[:2])),
        "",
        "Each section shows what the command prints, run when this site was built (in an empty "
        "directory, with the plugins the site documents installed: run from a directory with a `conf/` or "
        "an `experiments/` of yours, `ddlkit --help` lists your presets and experiments too). Exit "
        "statuses: 0 done, 1 failed, 2 a usage or configuration error (one line, `ddlkit: error: ...`), 3 a "
        "plugin's error, 75 stopped after saving a checkpoint ([the job directory](results.md#exit-statuses) "
        "lists them).",
        "",
    ]
    sections = [("ddlkit", cli.run_main, ("--help",))] + [
        (f"ddlkit {s}", cli.SUBCOMMANDS[s], (s,) if s == "plugins" else (s, "--help")) for s in subcommands
    ]
    for title, function, args in sections:
        out += [f"## {title}", "", first_paragraph(function.__doc__), ""]
        if title != "ddlkit" and first[args] == first[("--help",)]:
            out += [
                f"`ddlkit {' '.join(args)}` prints the help of `ddlkit --help` above: it takes the same overrides.",
                "",
            ]
        else:
            out += [
                f"`ddlkit {' '.join(args)}`" + (" prints the installed plugins:" if args == ("plugins",) else ":"),
                "",
                _block(first[args]),
            ]
        for command in nested:
            if command[0] == args[0] and title != "ddlkit":
                text = second[tuple(command)]
                if text != first[args]:  # a positional choice (``compute down``) prints its parent's help
                    out += [
                        f"### {' '.join(['ddlkit', *command[:-1]])}",
                        "",
                        f"`ddlkit {' '.join(command)}`:",
                        "",
                        _block(text),
                    ]
    return "\n".join(out)
