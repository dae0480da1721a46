"""``framework.num_threads``: the intra-op threads each rank computes with, one rule for every
framework.

``auto`` (the default) is ``OMP_NUM_THREADS`` when the user or the compute target set it
(``compute=slurm`` sets the CPUs Slurm gave each task, ``compute=local_mpi`` the cores per rank),
else the cores this process may run on (``os.sched_getaffinity``: a cgroup or ``taskset`` counts)
shared by the ranks of its node, at least one. An integer sets the count; 0 leaves it to the
framework (all cores, as before ``auto``).

All cores alone is not what made the old default collapse on a busy machine: OpenMP's threads
spin while they wait for each other, and a spinning thread holds the core that its partner,
descheduled for other work, needs. So a rank with ``auto`` threads also gets
``OMP_WAIT_POLICY=PASSIVE`` (:data:`WAIT_POLICY`, unless set): waiting threads sleep. Measured on
2 cores (PyTorch, 32 px, batch 32, ``benchmarks/threads.py``, medians of 3 rounds), images/s for
all cores spinning (the old default) / 1 thread / ``auto``: with 2 busy processes beside, a tiny
CNN 166 / 4,305 / 2,574 and ResNet-18 52 / 251 / 267; on the quiet machine 6,937 / 4,454 / 4,407
and 444 / 266 / 340. Passive waiting is the one choice that never collapses: it gives up 23-36 %
on cores nobody else uses, where spinning threads lose 5-16x on shared ones. A shorter spin
(``GOMP_SPINCOUNT=10000``) sits between (quiet: 6,080 and 489; busy: 2,233 and 164) and is
what to set, with ``OMP_WAIT_POLICY`` unset, on cores a scheduler gives a job alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError

__all__ = ["AUTO", "WAIT_POLICY", "check", "per_rank", "rank_environment"]

AUTO = "auto"
#: what a rank with ``auto`` threads gets in its environment (OpenMP reads it when it loads)
WAIT_POLICY = {"OMP_WAIT_POLICY": "PASSIVE"}


def check(value: Any, framework: str) -> None:
    """A ConfigError unless ``value`` is ``auto`` or a count >= 0."""
    if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return
    raise ConfigError(
        f"framework.num_threads={value} is invalid: use auto (the cores this process may use, shared "
        f"by the ranks of its node), a number of threads >= 1, or 0 ({framework}'s default: all cores)."
    )


def per_rank(value: Any, local_size: int, env: Mapping[str, str] | None = None) -> int:
    """The intra-op threads of one rank for ``framework.num_threads=value`` with ``local_size``
    ranks on its node; 0: the framework's default. A number above the cores this process may use
    is capped there, with a warning: 100000 threads starve the machine (and libgomp dies)."""
    if value != AUTO:
        cores = len(os.sched_getaffinity(0))
        if int(value) > cores:
            print(
                f"ddlkit: warning: framework.num_threads={value} is more than the {cores} cores this rank may use; "
                f"using {cores}",
                file=sys.stderr,
                flush=True,
            )
            return cores
        return int(value)
    env = os.environ if env is None else env
    given = env.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, len(os.sched_getaffinity(0)) // max(local_size, 1))


def rank_environment(value: Any, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the ranks' environment needs for ``framework.num_threads=value`` (launcher side): the
    passive wait policy with ``auto``, unless the user chose one."""
    env = os.environ if env is None else env
    if value != AUTO or any(k in env for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")):
        return {}
    return dict(WAIT_POLICY)
