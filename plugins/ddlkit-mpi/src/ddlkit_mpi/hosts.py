"""The hosts of a ``compute=mpi`` job: from ``compute.hosts``, ``compute.hostfile``, or the
allocation a cluster scheduler hands over.

A :class:`Host` is a name and its slots (how many ranks it may run; ``None`` when the source does
not say). Sources, in the order :func:`discover` looks:

* ``compute.hosts=[a:4,b:4]`` (``name`` or ``name:slots``);
* ``compute.hostfile=FILE``: OpenMPI's hostfile syntax, ``host [slots=N] [max_slots=M]`` per line,
  ``#`` comments and blank lines; a host named on several lines adds up its slots (as OpenMPI does);
* ``$AZ_BATCHAI_MPI_HOST_FILE``: the hostfile Azure Batch AI writes for an MPI job;
* ``$AZ_BATCH_HOST_LIST``: Azure Batch's multi-instance task hosts, ``ip,ip,...``;
* ``$PBS_NODEFILE``: PBS/Torque's node file, one line per slot;
* ``$SLURM_JOB_NODELIST`` (or ``$SLURM_NODELIST``): a Slurm allocation (``node[01-03,07],gpu-a``),
  its slots from ``$SLURM_NTASKS_PER_NODE`` or ``$SLURM_TASKS_PER_NODE`` (``4(x2),2``).

Bad input is a :class:`ddlkit.ConfigError` with one line that names the file and line.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import ddlkit

#: a host name or address as it may stand in a hostfile (names, IPv4, IPv6 without brackets)
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.:%-]+$")
#: the per-host keys of an OpenMPI hostfile line (``slot``/``count``/``cpu`` are old spellings of ``slots``)
_SLOT_KEYS = {"slots", "slot", "count", "cpu", "cpus"}
_MAX_SLOT_KEYS = {"max_slots", "max-slots"}


@dataclass(frozen=True)
class Host:
    name: str
    #: ranks it may run; None when its source does not say
    slots: int | None = None


def _merge(hosts: Iterable[Host]) -> list[Host]:
    """Hosts named more than once add up their slots; the first mention keeps its place."""
    merged: dict[str, Host] = {}
    for h in hosts:
        if h.name in merged:
            # each mention without a count is one slot, as in OpenMPI's hostfiles
            merged[h.name] = Host(h.name, (merged[h.name].slots or 1) + (h.slots or 1))
        else:
            merged[h.name] = h
    return list(merged.values())


def _is_ipv6(text: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6, text)
    except OSError:
        return False
    return True


def _positive(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def parse_hostfile(path: str | os.PathLike[str], *, what: str = "hostfile") -> list[Host]:
    """The hosts of an OpenMPI hostfile. ``what`` names the file's source in errors."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ddlkit.ConfigError(f"{what} {path} does not exist.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ddlkit.ConfigError(f"{what} {path} cannot be read: {e}.") from None
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *options = line.split()

        def bad(why: str, number: int = number, raw: str = raw) -> ddlkit.ConfigError:
            return ddlkit.ConfigError(
                f"{what} {path}, line {number}: {why} in {raw.strip()!r} (expected `host [slots=N] [max_slots=M]`)."
            )

        if not _HOST_NAME.match(name) or "=" in name:
            raise bad(f"{name!r} is not a host name")
        slots: int | None = None
        for option in options:
            key, sep, value = option.partition("=")
            if not sep:
                raise bad(f"{option!r} is not `key=value`")
            if key in _SLOT_KEYS:
                slots = _positive(value)
                if slots is None:
                    raise bad(f"{key}={value} is not a positive integer")
            elif key in _MAX_SLOT_KEYS:
                if _positive(value) is None:
                    raise bad(f"{key}={value} is not a positive integer")
            else:
                raise bad(f"unknown key {key!r}")
        hosts.append(Host(name, slots))
    if not hosts:
        raise ddlkit.ConfigError(f"{what} {path} names no host.")
    return _merge(hosts)


def parse_hosts(entries: Iterable[str]) -> list[Host]:
    """``compute.hosts=[a:4,b:4]``: ``name`` or ``name:slots`` per entry."""
    hosts = []
    for entry in entries:
        entry = str(entry).strip()
        if ":" in entry and not _is_ipv6(entry):
            name, sep, slots_text = entry.rpartition(":")
        else:
            name, sep, slots_text = entry, "", ""
        slots = _positive(slots_text) if sep else None
        if not name or not _HOST_NAME.match(name) or (":" in name and not _is_ipv6(name)) or (sep and slots is None):
            raise ddlkit.ConfigError(
                f"compute.hosts: {entry!r} is not a host (expected `name` or `name:slots`, "
                "e.g. compute.hosts=[node1:4,node2:4])."
            )
        hosts.append(Host(name, slots))
    if not hosts:
        raise ddlkit.ConfigError("compute.hosts is empty.")
    return _merge(hosts)


def parse_nodefile(path: str | os.PathLike[str], *, what: str) -> list[Host]:
    """A PBS node file: one host name per line and slot."""
    path = Path(path)
    try:
        names = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    except FileNotFoundError:
        raise ddlkit.ConfigError(f"{what} {path} does not exist.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ddlkit.ConfigError(f"{what} {path} cannot be read: {e}.") from None
    hosts = []
    for number, name in enumerate(names, 1):
        if not name or name.startswith("#"):
            continue
        if not _HOST_NAME.match(name):
            raise ddlkit.ConfigError(f"{what} {path}, line {number}: {name!r} is not a host name.")
        hosts.append(Host(name, 1))
    if not hosts:
        raise ddlkit.ConfigError(f"{what} {path} names no host.")
    return _merge(hosts)


# ---------------------------------------------------------------------------- Slurm
def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets: ``a[1,2],b`` -> ``["a[1,2]", "b"]``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ']'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("unbalanced '['")
    parts.append(text[start:])
    return parts


def _expand_range(spec: str) -> list[str]:
    """``01-03,7`` -> ``["01", "02", "03", "7"]`` (zero padding kept, as Slurm does)."""
    out = []
    for part in spec.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {part!r}")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"bad range {part!r}")
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


def _expand_name(name: str) -> list[str]:
    """One host expression, which may hold several bracket groups: ``r[1-2]n[1,3]``."""
    match = re.search(r"\[([^\[\]]*)\]", name)
    if not match:
        return [name]
    head, tail = name[: match.start()], name[match.end() :]
    return [f"{head}{n}{rest}" for n in _expand_range(match.group(1)) for rest in _expand_name(tail)]


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """``node[01-03,07],gpu-a`` -> ``[node01, node02, node03, node07, gpu-a]`` -- what
    ``scontrol show hostnames`` prints. ValueError if it is not a Slurm node list."""
    names = []
    for part in _split_top(nodelist.strip()):
        part = part.strip()
        if not part:
            raise ValueError("empty host")
        names.extend(_expand_name(part))
    for name in names:
        if not _HOST_NAME.match(name):
            raise ValueError(f"{name!r} is not a host name")
    return names


def slurm_tasks_per_node(value: str, nodes: int) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` (``4(x2),2``) as one count per node; ValueError if malformed."""
    counts = []
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"bad item {part!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    if len(counts) != nodes:
        raise ValueError(f"{len(counts)} counts for {nodes} nodes")
    return counts


def _slurm_hosts(env: Mapping[str, str], var: str) -> list[Host]:
    try:
        names = expand_slurm_nodelist(env[var])
    except ValueError as e:
        raise ddlkit.ConfigError(f"${var}={env[var]!r} is not a Slurm node list: {e}.") from None
    if per_node := env.get("SLURM_NTASKS_PER_NODE", "").strip():
        if _positive(per_node) is None:
            raise ddlkit.ConfigError(f"$SLURM_NTASKS_PER_NODE={per_node!r} is not a positive integer.")
        slots: list[int | None] = [int(per_node)] * len(names)
    elif tasks := env.get("SLURM_TASKS_PER_NODE", "").strip():
        try:
            slots = list(slurm_tasks_per_node(tasks, len(names)))
        except ValueError as e:
            raise ddlkit.ConfigError(f"$SLURM_TASKS_PER_NODE={tasks!r} does not fit ${var}: {e}.") from None
    else:
        slots = [None] * len(names)
    return _merge(Host(n, s) for n, s in zip(names, slots, strict=True))


# ---------------------------------------------------------------------------- discovery
#: where :func:`discover` looks when the config names no hosts, in order
SCHEDULER_SOURCES = (
    "AZ_BATCHAI_MPI_HOST_FILE",
    "AZ_BATCH_HOST_LIST",
    "PBS_NODEFILE",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
)


def discover(
    hosts: Iterable[str] | None, hostfile: str | None, env: Mapping[str, str] | None = None
) -> tuple[list[Host], str]:
    """The job's hosts and a phrase naming where they came from (for messages and ``plan``)."""
    env = os.environ if env is None else env
    hosts = list(hosts or [])
    if hosts and hostfile:
        raise ddlkit.ConfigError("compute.hosts and compute.hostfile are both set: give one of them.")
    if hosts:
        return parse_hosts(hosts), "compute.hosts"
    if hostfile:
        return parse_hostfile(hostfile, what="compute.hostfile"), f"compute.hostfile={hostfile}"
    for var in SCHEDULER_SOURCES:
        value = env.get(var, "").strip()
        if not value:
            continue
        if var == "AZ_BATCHAI_MPI_HOST_FILE":
            return parse_hostfile(value, what=f"${var}"), f"${var}"
        if var == "AZ_BATCH_HOST_LIST":
            names = [n.strip() for n in value.split(",")]
            bad = [n for n in names if not n or not _HOST_NAME.match(n)]
            if bad:
                raise ddlkit.ConfigError(f"${var}={value!r} is not a comma-separated list of hosts.")
            return _merge(Host(n) for n in names), f"${var}"
        if var == "PBS_NODEFILE":
            return parse_nodefile(value, what=f"${var}"), f"${var}"
        return _slurm_hosts(env, var), f"${var}"
    raise ddlkit.ConfigError(
        "compute=mpi found no hosts: set compute.hosts=[host:slots,...] or "
        "compute.hostfile=FILE, or run it inside a cluster job; looked at compute.hosts, "
        "compute.hostfile, " + ", ".join(f"${v}" for v in SCHEDULER_SOURCES) + " (all unset)."
    )
