"""Reading a growing file (a job's log) from an offset on, over HTTP, whatever the server does with
``Range``: the log followers of ``compute=azureml`` and ``compute=batchai`` ask for
``Range: bytes=<offset>-`` and take the answer through :func:`bytes_from`; :class:`RangedLog`
hands the bytes out as text from a character offset, as :meth:`ddlkit.compute.scheduler.Scheduler.read_log`
takes them, and :func:`follow_paced` follows the log at the service's pace.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import requests


def range_header(start: int) -> dict[str, str]:
    """The header that asks for the bytes from ``start`` on."""
    return {"Range": f"bytes={start}-"}


def bytes_from(response: requests.Response, start: int) -> bytes | None:
    """The bytes from ``start`` on in the answer to a read with :func:`range_header`: a 206 is that
    range; a 200 is the whole file -- a server that ignores ``Range`` -- whose first ``start`` bytes
    were read before; a 416 is nothing past ``start`` yet. None for any other status (the caller's
    error to raise)."""
    if response.status_code == 206:
        return response.content
    if response.status_code == 200:
        return response.content[start:]
    if response.status_code == 416:
        return b""
    return None


class RangedLog:
    """A log read by byte ranges, handed out as text from a character offset: a read from where the
    last one stopped asks for the new bytes only (a character split between two reads is kept for
    the next); any other offset (the log's last lines, a second reader) reads the whole file."""

    def __init__(self) -> None:
        self._chars = self._bytes = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self, offset: int, fetch: Callable[[int], bytes]) -> str:
        """The text from character ``offset`` on; ``fetch(start)``: the file's bytes from ``start`` on."""
        if offset != self._chars:
            return fetch(0).decode("utf-8", errors="replace")[offset:]
        data = fetch(self._bytes)
        self._bytes += len(data)
        text = self._decoder.decode(data)
        self._chars += len(text)
        return text


def follow_paced(read: Callable[[int], str], offset: int, done: Callable[[], bool], pace_s: float) -> Iterator[str]:
    """:meth:`ddlkit.compute.scheduler.Scheduler.follow_log` for a service whose every read is a request: one
    read of the log from ``offset`` per ``pace_s`` while the job runs, then until a read finds
    nothing new."""
    while True:
        finished = done()
        text = read(offset)
        offset += len(text)
        if text:
            yield text
        elif finished:
            return
        if not finished:
            time.sleep(pace_s)
