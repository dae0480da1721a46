"""Which files of a build context a ``.dockerignore`` lets in, as Docker (moby's patternmatcher) decides.

Its rules differ from ``.gitignore``'s, so pathspec's gitignore matching would let in another set of
files: a pattern is anchored at the context's root (``*`` is one top-level name, not any name); ``*``
and ``?`` stay within one path segment and ``**`` spans any number of them; a pattern that matches a
directory matches everything below it; ``!pattern`` takes back what an earlier one left out, and the
last pattern that matches a path decides.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DockerIgnore"]


@dataclass(frozen=True)
class _Pattern:
    text: str
    regex: re.Pattern[str]
    #: a ``!pattern``: what it matches is let in again
    exception: bool


class DockerIgnore:
    """The patterns of one ``.dockerignore`` file (or none: everything is let in)."""

    def __init__(self, lines: list[str]) -> None:
        self._patterns = []
        for line in lines:
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            exception = text.startswith("!")
            text = posixpath.normpath(text.removeprefix("!").strip()).lstrip("/") or "."
            self._patterns.append(_Pattern(text, _compile(text), exception))

    @classmethod
    def read(cls, path: Path) -> DockerIgnore:
        return cls(path.read_text(encoding="utf-8").splitlines() if path.is_file() else [])

    def excludes(self, path: str) -> bool:
        """Whether ``path`` (relative to the context, POSIX) stays out of the context."""
        parents = path.split("/")[:-1]
        excluded = False
        for pattern in self._patterns:
            matched = bool(pattern.regex.match(path)) or any(
                pattern.regex.match("/".join(parents[: i + 1])) for i in range(len(parents))
            )
            if matched:
                excluded = not pattern.exception
        return excluded

    def files(self, root: Path) -> Iterator[str]:
        """The files below ``root`` let into the context, relative to it (POSIX), a directory's files before
        its subdirectories'. A directory that is left out is not walked unless an exception could take
        something below it back."""
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath).relative_to(root).as_posix()
            prefix = "" if here == "." else f"{here}/"
            dirnames[:] = sorted(
                d for d in dirnames if not self.excludes(prefix + d) or self._may_take_back_below(prefix + d)
            )
            for name in sorted(filenames):
                if not self.excludes(prefix + name):
                    yield prefix + name

    def _may_take_back_below(self, directory: str) -> bool:
        """Whether an exception could match a path below ``directory``: its segments match the
        directory's segment by segment (``**`` matches any)."""
        segments = directory.split("/")
        for pattern in self._patterns:
            if not pattern.exception:
                continue
            parts = pattern.text.split("/")
            if (
                "**" in parts[: len(segments)]
                or len(parts) > len(segments)
                and all(_compile(part).match(segment) for part, segment in zip(parts, segments, strict=False))
            ):
                return True
        return False


def _compile(pattern: str) -> re.Pattern[str]:
    """moby's translation: ``**`` (with the ``/`` after it) any number of segments, ``*`` and ``?``
    within one, ``[...]`` a character class (``[!...]`` its complement), ``\\`` escapes the next character."""
    regex, i = "", 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            regex += ".*" if i >= len(pattern) else "(.*/)?"
            continue
        if ch == "*":
            regex += "[^/]*"
        elif ch == "?":
            regex += "[^/]"
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                regex += re.escape(ch)
            else:
                members = pattern[i + 1 : end].replace("\\", "\\\\")
                regex += "[" + ("^" + members[1:] if members.startswith("!") else members) + "]"
                i = end
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            regex += re.escape(pattern[i])
        else:
            regex += re.escape(ch)
        i += 1
    return re.compile(regex + r"\Z")
