"""Writes the site's generated pages (run by mkdocs-gen-files at build time; see docs/_gen)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _gen import generate  # found beside this script (the sys.path entry above)

started = time.perf_counter()
pages = generate()
for path, content in pages.items():
    with mkdocs_gen_files.open(path, "wb" if isinstance(content, bytes) else "w") as out:
        out.write(content)
print(f"docs/gen_pages.py: {len(pages)} files in {time.perf_counter() - started:.1f} s", file=sys.stderr)
