"""Free ports for a job's rendezvous, chosen where no other process is handed them.

A target that picks rank 0's ports itself (``MASTER_PORT`` and the control plane's, one after the
other) learns they are free seconds before rank 0 binds them: the ranks start, import their
framework, and only then listen. Asking the kernel for a free port (binding port 0) returns one
from its ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default),
the very range it hands to every outgoing connection and every other port-0 bind on the machine
in the meantime: a busy machine gives the port away, and rank 0 fails with ``EADDRINUSE``.

:func:`free_ports` picks at random *below* that range (from 20000, above the ports services
such as Ray's workers, 10002-19999, take by default), and checks each port by binding it: only a
process that names the same port itself can still take it.
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

#: the lowest port chosen (ports below belong to services by convention: Ray's workers take 10002-19999)
LOWEST_PORT = 20000
#: Linux's default ephemeral range, where /proc does not tell
DEFAULT_EPHEMERAL = (32768, 60999)
#: drawn from the OS, never from a seed a job or a test set: two launchers must not pick alike
_RANDOM = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands to connections and port-0 binds on this machine."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def free_ports(n: int = 1, *, host: str = "127.0.0.1", tries: int = 200) -> list[int]:
    """``n`` consecutive ports that are free on ``host`` (``""``: every interface) now, outside the
    kernel's ephemeral range where it leaves room (else from it, as binding port 0 would)."""
    low, high = ephemeral_range()
    if low - LOWEST_PORT >= 1024:
        candidates = range(LOWEST_PORT, low - n + 1)
    elif 65535 - high >= 1024:
        candidates = range(high + 1, 65536 - n)
    else:  # the whole range is ephemeral: nowhere is safer than what the kernel picks
        candidates = None
    for _ in range(tries):
        start = _RANDOM.choice(candidates) if candidates is not None else _kernel_port(host)
        if start + n - 1 > 65535:
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in range(start, start + n):
                    stack.enter_context(socket.socket()).bind((host, port))
            except OSError:
                continue
            return list(range(start, start + n))
    raise RuntimeError(f"no {n} consecutive free port(s) on {host or 'this machine'} after {tries} tries")


def _kernel_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
