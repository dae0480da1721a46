"""The documentation site builds with no warning and renders in a browser (issue 39).

``mkdocs build --strict`` runs docs/gen_pages.py (the generated reference, how-to and benchmark pages)
and checks every link and anchor; the built site is then served on 127.0.0.1 and loaded in headless
Chromium (Debian's ``chromium``): the home page, the first tutorial and the options reference render
with the site's navigation, and the page's search code fetches the search index. Screenshots (PNG),
the pages' DOM and the build's log are kept in ``$DDLKIT_TEST_ARTIFACTS/docs-site`` (a temporary
directory when unset), which the test prints.

Needs the docs extra (``pip install -e .[docs]``), every first-party plugin (the generated pages
document them all) and Chromium: .ci/run installs them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.plugins, pytest.mark.extras]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: the pages loaded in the browser: the home page, a tutorial, a generated reference page
PAGES = {"home": "", "first-run": "tutorials/first-run/", "options": "reference/options/"}
#: environment for mkdocs: no banners from the theme and its plugins' notices on stdout
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true", "NO_COLOR": "1"}


@dataclass(frozen=True)
class Site:
    path: Path
    log: str
    returncode: int
    seconds: float


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = os.environ.get("DDLKIT_TEST_ARTIFACTS")
    where = Path(base) / "docs-site" if base else tmp_path_factory.mktemp("docs-site")
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture(scope="module")
def site(artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Site:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e .[docs]")
    out = tmp_path_factory.mktemp("site") / "site"
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        env={**os.environ, **QUIET},
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.perf_counter() - started
    log = proc.stdout + proc.stderr
    (artifacts / "build.log").write_text(f"mkdocs build --strict: exit {proc.returncode}, {seconds:.1f} s\n\n{log}")
    return Site(out, log, proc.returncode, seconds)


def _report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(f"\n{line}")


def test_the_site_builds_strict_with_no_warning(
    site: Site, artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    warnings = [line for line in site.log.splitlines() if re.match(r"^(WARNING|ERROR)\b", line)]
    _report(
        capsys,
        f"docs: mkdocs build --strict took {site.seconds:.1f} s, {len(warnings)} warnings "
        f"(log: {artifacts / 'build.log'})",
    )
    assert site.returncode == 0 and not warnings, "\n".join(warnings) or site.log[-3000:]


def test_every_page_of_the_nav_and_every_generated_page_is_built(site: Site) -> None:
    assert site.returncode == 0, site.log[-3000:]
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from _gen import REFERENCE, options
    finally:
        sys.path.remove(str(ROOT / "docs"))
    generated = [
        *REFERENCE,
        *options.howto_pages(),
        "benchmarks/index.md",
        *(f"benchmarks/{p.stem}.md" for p in (ROOT / "benchmarks" / "results").glob("*.json")),
    ]
    for page in [*_nav_pages(), *generated]:
        html = site.path / (
            "index.html"
            if page == "index.md"
            else page.removesuffix(".md").removesuffix("index")
            + ("/index.html" if not page.endswith("index.md") else "index.html")
        )
        assert html.is_file(), f"{page}: {html} was not built"
    for plot in (ROOT / "benchmarks" / "results").glob("*.png"):
        assert (site.path / "benchmarks" / plot.name).is_file(), plot.name


def test_the_search_index_holds_every_page(site: Site) -> None:
    assert site.returncode == 0, site.log[-3000:]
    index = json.loads((site.path / "search" / "search_index.json").read_text())
    locations = {doc["location"].partition("#")[0] for doc in index["docs"]}
    for page in _nav_pages():
        url = (
            ""
            if page == "index.md"
            else page.removesuffix(".md").removesuffix("index") + ("" if page.endswith("index.md") else "/")
        )
        assert url in locations, f"{page} is not in the search index"
    texts = " ".join(doc["text"] for doc in index["docs"] if doc["location"].startswith("reference/options/"))
    assert "trainer.batch_size" in texts and "compute.nodes" in texts  # the generated reference's content


def _nav(node: object) -> Iterator[tuple[str | None, str]]:
    """(section title or None, page path) of every page in mkdocs.yml's nav."""
    if isinstance(node, list):
        for item in node:
            yield from _nav(item)
    elif isinstance(node, dict):
        for title, value in node.items():
            if isinstance(value, str):
                yield None, value
            else:
                for _, page in _nav(value):
                    yield title, page
    elif isinstance(node, str):
        yield None, node


def _config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def _nav_pages() -> list[str]:
    return [page for _, page in _nav(_config()["nav"])]


def _sections() -> list[str]:
    """The nav's top-level sections (Tutorials, How-to guides, Reference, ...)."""
    return [
        title
        for item in _config()["nav"]
        if isinstance(item, dict)
        for title, value in item.items()
        if isinstance(value, list)
    ]


@pytest.fixture(scope="module")
def served(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The built site on http://127.0.0.1:<a free port>/, and the server's request log."""
    if site.returncode != 0:
        pytest.fail("the site did not build: " + site.log[-2000:])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("http") / "requests.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port), "--directory", str(site.path)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        yield url, log
    finally:
        server.terminate()
        server.wait(timeout=10)


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"Chromium is not installed ({CHROMIUM}): apt-get install chromium (.ci/run installs it)")
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1280,2000",
            "--virtual-time-budget=8000",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize("name", list(PAGES))
def test_a_page_renders_in_a_browser_with_its_navigation(
    name: str, served: tuple[str, Path], artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = served[0] + PAGES[name]
    shot = artifacts / f"{name}.png"
    shot.unlink(missing_ok=True)
    proc = _chromium(f"--screenshot={shot}", url)
    assert shot.is_file() and shot.stat().st_size > 10_000, f"no screenshot of {url}: {proc.stderr[-2000:]}"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dom = _chromium("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    (artifacts / f"{name}.html").write_text(dom.stdout)
    _report(capsys, f"docs: {url} -> {shot}")
    html = dom.stdout
    nav = re.search(r'<nav class="md-nav md-nav--primary".*?</nav>\s*</div>\s*</div>\s*</div>', html, re.S)
    assert nav, f"{url}: no primary navigation in the page"
    for section in _sections():
        assert f">{section}<" in re.sub(r">\s+", ">", re.sub(r"\s+<", "<", nav.group(0))), (
            f"{url}: the navigation lacks the section {section!r}"
        )
    assert 'class="md-search"' in html, f"{url}: no search box"
    assert "<h1" in html
    if name == "options":
        assert 'id="trainer.batch_size"' in html and 'id="compute-slurm.nodes"' in html


def test_the_page_loads_the_search_index(served: tuple[str, Path]) -> None:
    """The theme's search runs in a web worker that fetches search/search_index.json when a page
    loads: the server saw the request."""
    url, log = served
    _chromium("--dump-dom", url + "reference/options/")
    deadline = time.monotonic() + 10
    while "GET /search/search_index.json" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    requests = log.read_text()
    assert re.search(r'"GET /search/search_index\.json HTTP/1\.[01]" 200', requests), requests[-3000:]
