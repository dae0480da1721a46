"""Reading a growing file (a job's log) from an offset on, over HTTP, whatever the server does with
``Range``: the log followers of ``compute=azureml`` and ``compute=batchai`` ask for
``Range: bytes=<offset>-`` and take the answer through :func:`bytes_from`; :class:`RangedLog`
hands the bytes out as text from a character offset, as :meth:`ddlkit.compute.scheduler.Scheduler.read_log`
takes them, and :func:`follow_paced` follows the log at the service's pace. :func:`get_with_retries`
reads through azure-core's retry policy, the one the SDKs' own calls go through: a log read is
retried as a call to the service is.
"""

from __future__ import annotations

import codecs
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ddlkit import ConfigError

#: the connect and read timeouts of a log read (a read is the answer to one ranged GET)
CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 10, 60


class LogUnreadable(ConfigError):
    """A job's log could not be read (its storage refused, dropped or did not answer, retries
    included): the job itself is not affected."""


def get_with_retries(url: str, headers: Mapping[str, str] | None = None) -> Any:
    """``GET url`` through azure-core's pipeline with its default :class:`RetryPolicy` (what the
    ARM and Azure ML clients use: refused and dropped connections and 408/429/5xx answers retried
    with back-off); the answer (``status_code``, ``content``), or the SDK's ``ServiceRequestError``
    / ``ServiceResponseError`` once the policy gave up."""
    from azure.core import PipelineClient
    from azure.core.pipeline.policies import RetryPolicy
    from azure.core.pipeline.transport import RequestsTransport
    from azure.core.rest import HttpRequest

    transport = RequestsTransport(connection_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S)
    with PipelineClient(base_url=url, policies=[RetryPolicy()], transport=transport) as client:
        return client.send_request(HttpRequest("GET", url, headers=dict(headers or {})))


def range_header(start: int) -> dict[str, str]:
    """The header that asks for the bytes from ``start`` on."""
    return {"Range": f"bytes={start}-"}


def bytes_from(response: Any, start: int) -> bytes | None:
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


def follow_paced(
    read: Callable[[int], str], offset: int, done: Callable[[], bool], pace_s: float, *, running: str = ""
) -> Iterator[str]:
    """:meth:`ddlkit.compute.scheduler.Scheduler.follow_log` for a service whose every read is a request: one
    read of the log from ``offset`` per ``pace_s`` while the job runs, then until a read finds
    nothing new. A read that gives up (:class:`LogUnreadable`, its retries spent) ends the
    following, not the job: its error and ``running`` (that the job runs on, and how to follow it
    again) go to stderr, and the caller waits for the job's end as it would have after its log."""
    while True:
        finished = done()
        try:
            text = read(offset)
        except LogUnreadable as err:
            tail = f" {running}." if running and not finished else ""
            print(f"ddlkit: {err}{tail}", file=sys.stderr, flush=True)
            return
        offset += len(text)
        if text:
            yield text
        elif finished:
            return
        if not finished:
            time.sleep(pace_s)
