"""Retrying storage requests: :func:`retry` tries again after a :class:`TransientStorageError`
(which backends raise for timeouts, throttling and 5xx answers), with exponential backoff, saying
so on stderr."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import RunError

T = TypeVar("T")


class TransientStorageError(OSError):
    """A storage operation failed in a way that may succeed when retried (timeouts, throttling,
    5xx answers). Backends raise it so that :func:`retry` knows what to try again."""


#: seconds a small request (one that moves no file: a listing, a write check) may go unanswered
#: before :func:`retry` says that it waits
WAIT_NOTICE_S = 8.0


def retry(fn: Callable[[], T], *, what: str, attempts: int = 5, base_delay_s: float = 0.5, small: bool = False) -> T:
    """Call ``fn`` until it succeeds, retrying :class:`TransientStorageError` (and other OSErrors
    but "not found") with exponential backoff; the last error propagates, naming ``what``.

    Each retry is announced on stderr with its delay, and with ``small`` (``fn`` moves no file, so
    a working endpoint answers it in a second) an attempt unanswered for :data:`WAIT_NOTICE_S`
    says so: a storage account that stopped answering shows up as lines within seconds, not as
    silence until a read times out. Backends keep their own SDK's retries off and bound each
    attempt (connect/read timeouts), so the worst case is ``attempts`` bounded attempts plus
    ``base_delay_s * (2**(attempts-1) - 1)`` seconds of waiting."""
    for attempt in range(1, attempts + 1):
        notice = threading.Timer(
            WAIT_NOTICE_S,
            lambda attempt=attempt: print(
                f"ddlkit: {what}: no answer for {WAIT_NOTICE_S:g} s; still waiting (attempt {attempt} of {attempts})",
                file=sys.stderr,
                flush=True,
            ),
        )
        notice.daemon = True
        if small:
            notice.start()
        try:
            return fn()
        except FileNotFoundError:
            raise
        except OSError as err:
            error = err
        finally:
            notice.cancel()
        if attempt == attempts:
            raise RunError(f"{what} failed after {attempts} attempts: {error}", component="storage") from error
        delay = base_delay_s * 2 ** (attempt - 1)
        print(
            f"ddlkit: {what} failed ({error}); retrying in {delay:g} s (attempt {attempt + 1} of {attempts})",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(delay)
    raise AssertionError("unreachable")
