"""Many files at once: :func:`parallel` runs one call per file on a thread pool, the first error
stopping the rest, and :class:`Progress` counts their bytes for whoever watches."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class Progress:
    """Counts bytes done out of a total: a live bar on a terminal, a line every 10 % otherwise."""

    def __init__(self, description: str, total_bytes: int, *, live: bool | None = None) -> None:
        self.description, self.total, self.done = description, total_bytes, 0
        self._lock = threading.Lock()
        self._next_report = 0.1
        self._bar = None
        if live if live is not None else sys.stderr.isatty():
            from rich.progress import BarColumn, DownloadColumn, TimeRemainingColumn, TransferSpeedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                transient=False,
            )
            self._task = self._bar.add_task(description, total=total_bytes)
            self._bar.start()

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            if self._bar is not None:
                self._bar.update(self._task, advance=nbytes)
            elif self.total and self.done / self.total >= self._next_report:
                self._next_report = int(self.done / self.total * 10) / 10 + 0.1
                print(
                    f"ddlkit: {self.description}: {size_text(self.done)} of {size_text(self.total)} "
                    f"({100 * self.done / self.total:.0f}%)",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def size_text(nbytes: float) -> str:
    """``1.50 GB``, or ``12.3 MB`` below 0.1 GB: a size as messages give it."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def parallel(fn: Callable[[T], None], items: Sequence[T], workers: int) -> None:
    """Run ``fn`` on every item with ``workers`` threads; the first error cancels what has not
    started and propagates."""
    if not items:
        return
    with ThreadPoolExecutor(max(1, min(workers, len(items)))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise
