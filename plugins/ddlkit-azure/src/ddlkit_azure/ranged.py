"""Reading a growing file (a job's log) from an offset on, over HTTP, whatever the server does with
``Range``: the log followers of ``compute=azureml`` and ``compute=batchai`` ask for
``Range: bytes=<offset>-`` and take the answer through :func:`bytes_from`.
"""

from __future__ import annotations

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
