"""The control plane: a star of TCP connections from every rank to rank 0, over which ranks agree
on what is not the framework's to say -- the mean of logged metrics, the step at which to stop,
barriers, broadcasts -- the same under every framework and backend (:class:`ddlkit.DistContext`
uses it; nothing here imports a framework). A rank that dies closes its connection: the others
fail at once instead of waiting out a timeout.

A rank that does not die but stops answering (SIGSTOP, a hung host, a lost network) closes
nothing, and the framework's all-reduce hangs on every live rank until its own timeout, which
names no rank. So the control plane also carries heartbeats, sent and read by threads of their
own (the main thread may sit in a collective for half an hour): rank 0 and each other rank hear
from each other every few seconds, a rank silent for ``dist.warn_after_s`` is reported while the
job waits, and a failure then names it (#17). A process that is merely slow keeps heart-beating.

A rank that dies fails the framework's collectives too, on every other rank, with the framework's
own error (gloo: ``Connection closed by peer``), which names no rank and reads like a fault in the
job's code. Rank 0 tells the other ranks at once which rank left (:meth:`ControlPlane.lost_ranks`),
so that each survivor can say that its error was a lost rank's consequence (``EXIT_LOST_PEER``,
which the restart policy restarts) rather than its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..compute.layout import CONTROL_ADDR_ENV
from ..errors import RankLostError, RunError

_HEADER = struct.Struct("!I")
#: metrics, flags and addresses are small; anything bigger is not a ddlkit rank talking
_MAX_MESSAGE = 1 << 24
#: the longest pause between two heartbeats; shorter when ``dist.warn_after_s`` is short
_HEARTBEAT_MAX_S = 5.0


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class ControlPlane:
    """Rank 0 holds one TCP connection to every other rank. Each collective is a gather to
    rank 0, a function of the gathered values computed there, and the result sent back, so
    every rank gets the same answer. Messages are length-prefixed JSON (never pickle: the
    port is reachable by anything on the network) carrying the operation's name and sequence
    number, so ranks that call different collectives fail loudly instead of mixing data.

    Every connection has a reader thread that routes what arrives: heartbeats to the table of
    when each peer was last heard from, everything else to that peer's inbox, where a
    collective waits for it at most ``timeout_s``. Once all ranks have joined (:meth:`connect`),
    a keep-alive thread sends the heartbeats and reports peers that stay silent (:meth:`_keep_alive`)."""

    def __init__(
        self, rank: int, world_size: int, peers: dict[int, socket.socket], timeout_s: float, warn_after_s: float = 60.0
    ) -> None:
        self.rank, self.world_size, self.timeout_s, self.warn_after_s = rank, world_size, timeout_s, warn_after_s
        #: on rank 0 the connection to each other rank; elsewhere {0: the connection to rank 0}
        self.peers = peers
        self.seq = 0
        #: seconds spent in collectives so far (waiting for the other ranks, mostly): the step telemetry's sync
        self.wait_s = 0.0
        #: the collective this rank is in now (its name and number), or None: a hang report says it
        self.in_op: tuple[str, int] | None = None
        #: the training step this rank is at, sent with its heartbeats (DistContext.track_step)
        self.step: Callable[[], int | None] = lambda: None
        #: what this rank is doing now (its step telemetry's phase), for a hang report
        self.where: Callable[[], str] = lambda: ""
        #: writes this rank's stacks for a hang report, given what heads them (DistContext.on_hang); None: no report
        self.on_dump: Callable[[str], str] | None = None
        #: rank -> its pid and host, as it said hello (rank 0): a rank on its host reads a silent one from outside
        self.members: dict[int, dict[str, Any]] = {}
        #: rank 0: the ranks' answers to the hang report asked last (rank -> what it said), and when all came
        self._dumped: dict[int, dict[str, Any]] = {}
        self._dump_answered = threading.Event()
        self._dump_round = 0
        self._dump_expected = 0
        now = time.monotonic()
        #: peer -> (when it was last heard from, the step it was then at)
        self._heard: dict[int, tuple[float, int | None]] = {peer: (now, None) for peer in peers}
        #: on the other ranks: the ranks that rank 0 finds silent -> (silent since, their last step)
        self._relayed: dict[int, tuple[float, int | None]] = {}
        #: peer -> (how many warn_after_s periods of its silence were reported, its silence's start)
        self._warned: dict[int, tuple[int, float]] = {}
        self._left: set[int] = set()
        #: on the other ranks: the ranks whose connection to rank 0 closed, as rank 0 tells them
        self._left_relayed: set[int] = set()
        self._someone_left = threading.Event()
        self._inbox: dict[int, queue.SimpleQueue[Any]] = {peer: queue.SimpleQueue() for peer in peers}
        # the main thread's messages and the heartbeats share the connections
        self._send_locks = {peer: threading.Lock() for peer in peers}
        self._closed = threading.Event()
        for peer, sock in peers.items():
            threading.Thread(
                target=self._read, args=(peer, sock), name=f"ddlkit-control-rank-{peer}", daemon=True
            ).start()

    @classmethod
    def connect(
        cls,
        rank: int,
        world_size: int,
        address: tuple[str, int],
        job_id: str,
        timeout_s: float,
        warn_after_s: float = 60.0,
    ) -> ControlPlane:
        deadline = time.monotonic() + timeout_s
        hello = {"rank": rank, "world_size": world_size, "job": job_id}
        # rank 0 keeps each rank's pid and host (members): a silent rank on its host, it reads from outside
        me = {**hello, "pid": os.getpid(), "host": socket.gethostname()}
        if rank == 0:
            peers = cls._accept_all(address, world_size, job_id, deadline)
        else:
            sock = cls._dial(address, deadline, rank)
            cls._send(sock, hello)
            peers = {0: sock}
        for sock in peers.values():
            sock.settimeout(timeout_s)
        plane = cls(rank, world_size, peers, timeout_s, warn_after_s)
        # one round trip: every rank returns only once rank 0 has accepted all of them
        plane.exchange("hello", me, lambda values: plane.members.update(enumerate(values)))
        # only now: a rank waiting here for the last one to start up is not a silent rank 0
        plane._heard = dict.fromkeys(peers, (time.monotonic(), None))
        threading.Thread(target=plane._keep_alive, name="ddlkit-control-heartbeat", daemon=True).start()
        return plane

    @staticmethod
    def _dial(address: tuple[str, int], deadline: float, rank: int) -> socket.socket:
        delay = 0.02
        while True:
            try:
                sock = socket.create_connection(address, timeout=max(0.1, deadline - time.monotonic()))
                if sock.getsockname() == sock.getpeername():
                    # TCP's self-connect: dialing a port of the ephemeral range on this host that nothing
                    # listens on yet (rank 0 still starting) can pick that very port as the source, and the
                    # socket connects to itself -- this rank would read its own hello as rank 0's answer
                    sock.close()
                    raise ConnectionRefusedError("connected to itself: rank 0 does not listen yet")
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except OSError as err:
                # rank 0 may not listen yet: retry until the deadline
                if time.monotonic() + delay > deadline:
                    raise RunError(
                        f"rank {rank} could not reach rank 0's control port {address[0]}:{address[1]} "
                        f"({err}); is rank 0 running, and is {CONTROL_ADDR_ENV} (or MASTER_ADDR) "
                        "its address?",
                        component="dist",
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    @classmethod
    def _accept_all(
        cls, address: tuple[str, int], world_size: int, job_id: str, deadline: float
    ) -> dict[int, socket.socket]:
        try:
            server = socket.create_server(address, backlog=world_size)
        except OSError as err:
            raise RunError(
                f"rank 0 cannot listen on {address[0]}:{address[1]} for the other ranks: {err}", component="dist"
            ) from None
        peers: dict[int, socket.socket] = {}
        try:
            while len(peers) < world_size - 1:
                server.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    missing = sorted(set(range(1, world_size)) - set(peers))
                    raise RankLostError(
                        f"ranks {missing} did not join within the dist timeout; they failed to "
                        "start (see their logs) or cannot reach rank 0"
                    ) from None
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # a rank says hello at once; a stray connection that does not may not hold up the job
                sock.settimeout(min(10.0, max(0.01, deadline - time.monotonic())))
                try:
                    hello = cls._recv(sock)
                except (OSError, ValueError):  # silent, or not our protocol
                    hello = None
                if (
                    not isinstance(hello, dict)
                    or hello.get("job") != job_id
                    or hello.get("world_size") != world_size
                    or hello.get("rank") in peers
                ):
                    sock.close()  # not one of ours: a stray connection, or another job's rank
                    continue
                peers[int(hello["rank"])] = sock
        finally:
            server.close()
        return peers

    @staticmethod
    def _send(sock: socket.socket, message: Any) -> None:
        data = json.dumps(message).encode()
        sock.sendall(_HEADER.pack(len(data)) + data)

    @staticmethod
    def _recv(sock: socket.socket) -> Any:
        header = _recv_exact(sock, _HEADER.size)
        if header is None:
            return None
        size = _HEADER.unpack(header)[0]
        if size > _MAX_MESSAGE:
            raise ValueError(f"a control message of {size} bytes: not from a ddlkit rank")
        data = _recv_exact(sock, size)
        return None if data is None else json.loads(data)

    def _send_to(self, peer: int, message: Any) -> None:
        with self._send_locks[peer]:
            self._send(self.peers[peer], message)

    def _read(self, peer: int, sock: socket.socket) -> None:
        """Route ``peer``'s messages until its connection ends; then a None in its inbox tells
        the collective that waits for it."""
        buffer = bytearray()
        try:
            while True:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    continue  # a quiet peer is the keep-alive thread's business
                if not chunk:
                    return
                buffer += chunk
                while len(buffer) >= _HEADER.size:
                    end = _HEADER.size + _HEADER.unpack_from(buffer)[0]
                    if end > _HEADER.size + _MAX_MESSAGE:
                        return  # not a ddlkit rank talking: as good as gone
                    if len(buffer) < end:
                        break
                    message = json.loads(buffer[_HEADER.size : end])
                    del buffer[:end]
                    self._route(peer, message)
        except (OSError, ValueError):  # reset by a peer that died, or closed here
            pass
        finally:
            self._left.add(peer)
            self._inbox[peer].put(None)
            self._someone_left.set()
            if self.rank == 0 and not self._closed.is_set():
                # the other ranks learn it now, not at the next heartbeat: their framework's
                # collective fails at this very moment, and they must tell why
                for other in list(self.peers):
                    if other not in self._left:
                        with contextlib.suppress(OSError, KeyError):
                            self._send_to(other, {"heartbeat": True, "left": [peer]})

    def _route(self, peer: int, message: Any) -> None:
        now = time.monotonic()
        if not isinstance(message, dict):
            message = {"error": f"rank {peer} sent {str(message)[:100]!r}, which is not a control message"}
        self._heard[peer] = (now, message.get("step", self._heard[peer][1]))
        if "heartbeat" not in message:
            self._inbox[peer].put(message)
        elif "silent" in message:  # rank 0's view of the other ranks
            self._relayed = {int(r): (now - age, step) for r, step, age in message["silent"]}
        elif "left" in message:  # rank 0 lost these ranks' connections
            self._left_relayed.update(int(r) for r in message["left"])
            self._someone_left.set()
        elif "dump" in message:  # rank 0 asks for this rank's stacks: a rank fell silent
            threading.Thread(target=self._answer_dump, args=(message,), name="ddlkit-hang-stacks", daemon=True).start()
        elif "dumped" in message and message["dumped"] == self._dump_round:
            self._dumped[peer] = message
            if len(self._dumped) >= self._dump_expected:
                self._dump_answered.set()

    def _recv_from(self, peer: int, op: str) -> Any:
        try:
            message = self._inbox[peer].get(timeout=self.timeout_s)
        except queue.Empty:
            raise RankLostError(
                f"rank {peer} did not reach `{op}` within {self.timeout_s:.0f} s (dist.timeout_s): {self._about(peer)}"
            ) from None
        if message is None:
            self._inbox[peer].put(None)  # the connection stays closed for the next collective too
            raise RankLostError(
                f"rank {peer} left the job during `{op}` (its connection closed): it failed or was stopped; see its log"
            )
        if "error" in message:
            raise RunError(f"rank {peer}: {message['error']}", component="dist")
        return message

    def exchange(self, op: str, data: Any, combine: Callable[[list[Any]], Any]) -> Any:
        """Gather ``data`` from every rank on rank 0, compute ``combine(values_in_rank_order)``
        there, and return that result on every rank."""
        self.seq += 1
        self.in_op = (op, self.seq)
        start = time.perf_counter()
        try:
            return self._exchange(op, data, combine)
        finally:
            self.wait_s += time.perf_counter() - start
            self.in_op = None

    def _exchange(self, op: str, data: Any, combine: Callable[[list[Any]], Any]) -> Any:
        if self.rank != 0:
            self._send_to(0, {"op": op, "seq": self.seq, "data": data, "step": self._current_step()})
            answer = self._recv_from(0, op)
            if (answer.get("op"), answer.get("seq")) != (op, self.seq) or "data" not in answer:
                # not rank 0's answer to this collective: a port reused by another process, or a bug
                raise RunError(
                    f"rank {self.rank} expected rank 0's answer to `{op}` #{self.seq} but got "
                    f"{str(answer)[:200]!r}: is another process listening on rank 0's control port?",
                    component="dist",
                )
            return answer["data"]
        try:
            values = [data]
            for peer in range(1, self.world_size):
                message = self._recv_from(peer, op)
                if (message["op"], message["seq"]) != (op, self.seq):
                    raise RunError(
                        f"ranks disagree on the collective: rank 0 is in `{op}` #{self.seq}, rank {peer} "
                        f"in `{message['op']}` #{message['seq']}",
                        component="dist",
                    )
                values.append(message["data"])
            result = combine(values)
        except RunError as err:
            # the other ranks learn why instead of seeing rank 0's connection drop
            self._broadcast_error(str(err))
            raise
        for peer in range(1, self.world_size):
            self._send_to(peer, {"op": op, "seq": self.seq, "data": result, "step": self._current_step()})
        return result

    def _broadcast_error(self, error: str) -> None:
        for peer in self.peers:
            with contextlib.suppress(OSError):
                self._send_to(peer, {"error": error})

    def close(self) -> None:
        self._closed.set()
        for sock in self.peers.values():
            # wakes this side's reader thread, which a plain close() leaves blocked in recv()
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.peers = {}

    # ------------------------------------------------------------ liveness
    def _keep_alive(self) -> None:
        """Every few seconds: a heartbeat to each peer (rank 0's carry the ranks it finds
        silent, so that every rank can name them), then :meth:`_watch`. Heartbeats and the
        collectives' messages carry the sender's step, so a silent rank's last one is known.
        A stopped or hung process sends none, all its threads standing still; a slow one does."""
        pace = min(_HEARTBEAT_MAX_S, self.warn_after_s / 4)
        ticked = time.monotonic()
        while not self._closed.wait(pace):
            now = time.monotonic()
            if now - ticked > self.warn_after_s / 2:
                # this process stood still itself (a whole job suspended with SIGSTOP, as Slurm's
                # `scontrol suspend` does): the peers' silence was not theirs
                self._heard = {peer: (now, step) for peer, (_, step) in list(self._heard.items())}
            ticked = now
            beat: dict[str, Any] = {"heartbeat": True, "step": self._current_step()}
            if self.rank == 0:
                beat["silent"] = [[peer, step, round(now - heard, 1)] for peer, heard, step in self._silent()]
            for peer in list(self.peers):
                if peer not in self._left:
                    # a connection that ended (its reader tells the collectives), or closed here meanwhile
                    with contextlib.suppress(OSError, KeyError):
                        self._send_to(peer, beat)
            self._watch()

    def _current_step(self) -> int | None:
        # never let a bad reading stop the heartbeats: the others would call this rank hung
        return _safely(self.step, None)

    def _silent(self) -> list[tuple[int, float, int | None]]:
        """(peer, last heard from, its step then) for each connected peer silent for warn_after_s."""
        now = time.monotonic()
        return [
            (peer, heard, step)
            for peer, (heard, step) in list(self._heard.items())
            if peer not in self._left and now - heard >= self.warn_after_s
        ]

    def _watch(self) -> None:
        """Say that a peer has been silent for ``warn_after_s``, again after each further such
        period, and when it answers again. A peer silent for longer than ``timeout_s`` by
        ``warn_after_s`` ends this rank: a framework collective with no timeout of its own
        (Horovod's) would otherwise wait for it forever, and one with a timeout has failed by now."""
        now = time.monotonic()
        silent_now: list[int] = []
        for peer, (heard, step) in list(self._heard.items()):
            silence = now - heard
            periods = 0 if peer in self._left else int(silence // self.warn_after_s)
            reported, since = self._warned.get(peer, (0, heard))
            if periods > reported:
                if not reported:
                    silent_now.append(peer)
                self._warned[peer] = (periods, heard)
                _say(
                    f"ddlkit: rank {peer} has not been heard from for {periods * self.warn_after_s:g} s (last "
                    f"{_at_step(step)}): stopped or hung? The job waits for it up to "
                    f"dist.timeout_s={self.timeout_s:g} s"
                )
            elif periods == 0 and reported:
                del self._warned[peer]
                if peer not in self._left:
                    _say(f"ddlkit: rank {peer} is answering again, after {heard - since:.0f} s of silence")
            if periods and silence > self.timeout_s + self.warn_after_s:
                _say(
                    f"ddlkit worker (rank {self.rank}): RunError: {self._silence(peer, heard, step, now)}; the job "
                    f"has waited for it longer than dist.timeout_s={self.timeout_s:g} s: this rank ends the job"
                )
                os._exit(1)
        if silent_now and self.rank == 0 and self.on_dump is not None:
            threading.Thread(
                target=self._hang_report, args=(silent_now,), name="ddlkit-hang-report", daemon=True
            ).start()

    # ------------------------------------------------------------ hang forensics (ddlkit.rank.hang)
    def _doing(self) -> dict[str, Any]:
        """Where this rank is: its step, its phase, the control-plane collective it is in."""
        op = self.in_op
        step, where = self._current_step(), _safely(self.where, "")
        return {"step": step, "where": where, "op": f"`{op[0]}` #{op[1]}" if op else ""}

    def _answer_dump(self, message: dict[str, Any]) -> None:
        doing = self._doing()
        path = ""
        why = message.get("why", "")
        if self.on_dump is not None:
            with contextlib.suppress(Exception):  # a report that cannot be written must not end the rank
                path = self.on_dump(_header(self.rank, self.world_size, doing, why))
        # silent ranks on this host that rank 0 (elsewhere) asks this rank to read from outside
        for peer, seen in (message.get("read") or {}).items():
            if path:
                self._read_from_outside(int(peer), int(seen["pid"]), seen.get("step"), why, Path(path))
        with contextlib.suppress(OSError, KeyError):
            self._send_to(0, {"heartbeat": True, "dumped": message["dump"], "file": path, **doing})

    def _read_from_outside(self, peer: int, pid: int, step: int | None, why: str, own: Path) -> None:
        """The stacks of ``peer``, a silent rank on this host, as py-spy reads them from outside, beside
        this rank's own stack file."""
        from .hang import write_stacks_of

        doing_then = {"step": step, "where": f"? (it did not answer: read from outside by rank {self.rank})"}
        with contextlib.suppress(OSError):
            header = _header(peer, self.world_size, doing_then, why, pid=pid)
            write_stacks_of(own.with_name(f"rank-{peer}.txt"), pid, header)

    def _hang_report(self, silent: list[int]) -> None:
        """Rank 0, when ``silent`` ranks fell silent: every rank that answers writes its stacks
        (asked over the heartbeat channel, which its reader thread serves while its main thread
        waits in a collective); a silent rank's stacks are read from outside with py-spy by a rank on
        its host (rank 0 on its own, else the first rank there that answers); then it says which
        ranks are not where the others wait."""
        start = time.monotonic()
        self._dump_round += 1
        self._dumped, why = {}, f"rank(s) {', '.join(map(str, silent))} silent for {self.warn_after_s:g} s"
        asked = [p for p in self.peers if p not in self._left and p not in silent]
        here = socket.gethostname()
        readers: dict[int, dict[str, dict[str, Any]]] = {}  # reader rank -> the silent ranks it reads
        for peer in silent:
            member = self.members.get(peer) or {}
            if not member.get("pid"):
                continue
            host = member.get("host")
            reader = (
                0 if host == here else next((p for p in asked if self.members.get(p, {}).get("host") == host), None)
            )
            if reader is not None:
                readers.setdefault(reader, {})[str(peer)] = {
                    "pid": member["pid"],
                    "step": self._heard.get(peer, (0.0, None))[1],
                }
        self._dump_answered.clear()
        self._dump_expected = len(asked)
        for peer in asked:
            with contextlib.suppress(OSError, KeyError):
                self._send_to(
                    peer, {"heartbeat": True, "dump": self._dump_round, "why": why, "read": readers.get(peer, {})}
                )
        if not asked:
            self._dump_answered.set()
        doing = self._doing()
        assert self.on_dump is not None
        own = self.on_dump(_header(0, self.world_size, doing, why))
        answers: dict[int, dict[str, Any]] = {0: {**doing, "file": own}}
        for peer, seen in readers.get(0, {}).items():
            if own:
                self._read_from_outside(int(peer), int(seen["pid"]), seen["step"], why, Path(own))
        self._dump_answered.wait(_DUMP_WAIT_S)
        answers.update(self._dumped)
        took = time.monotonic() - start
        for line in _verdict(answers, silent, self._heard, asked, took):
            _say(line)

    @staticmethod
    def _silence(peer: int, heard: float, step: int | None, now: float, witness: str = "") -> str:
        return (
            f"rank {peer} stopped answering {_at_step(step)}, {now - heard:.0f} s ago{witness} (its process is "
            "stopped or hung, or its host or the network is)"
        )

    def _about(self, peer: int) -> str:
        """What this rank knows of ``peer`` (and, from rank 0, of silent ranks) when a collective
        has waited for it in vain."""
        now = time.monotonic()
        heard, step = self._heard[peer]
        if now - heard >= self.warn_after_s:
            return "; ".join(self.silent_ranks())
        alive = (
            f"rank {peer} is alive (heard from {now - heard:.0f} s ago, {_at_step(step)}) but has not got "
            "there: it is much slower than this rank, or stuck in other work"
        )
        return "; ".join([alive, *self.silent_ranks()])

    def _relayed_silences(self, now: float) -> list[str]:
        return [
            self._silence(peer, since, step, now, ", as rank 0 sees it")
            for peer, (since, step) in self._relayed.items()
            if peer != self.rank
        ]

    def silent_ranks(self) -> list[str]:
        """One sentence per rank that stopped answering: this rank's own peers, and on the
        other ranks those that rank 0 reports."""
        now = time.monotonic()
        return [self._silence(peer, heard, step, now) for peer, heard, step in self._silent()] + self._relayed_silences(
            now
        )

    def lost_ranks(self, wait_s: float = 0.0) -> list[int]:
        """The ranks whose process ended (their connection closed): this rank's own peers and, on
        the other ranks, those that rank 0 reports. Waits up to ``wait_s`` for a first one: the
        framework's error about a dead peer can come before the control connection's end is read."""
        self._someone_left.wait(wait_s)
        return sorted(self._left | self._left_relayed)


_T = TypeVar("_T")
#: seconds rank 0 waits for the ranks' stack files
_DUMP_WAIT_S = 15.0


def _safely(read: Callable[[], _T], default: _T) -> _T:
    """What ``read()`` says, or ``default`` if it fails: a reading for a heartbeat or a hang report."""
    try:
        return read()
    except Exception:
        return default


def _header(rank: int, world_size: int, doing: dict[str, Any], why: str, pid: int | None = None) -> str:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return (
        f"# rank {rank} of {world_size} on {socket.gethostname()} (pid {pid or os.getpid()}), {at}\n"
        f"# {_at_step(doing.get('step'))}, in: {doing.get('where') or '?'}"
        + (f", in the control-plane collective {doing['op']}" if doing.get("op") else "")
        + f"\n# why: {why}"
    )


def _place(answer: dict[str, Any]) -> str:
    where = answer.get("where") or "?"
    return f"{where} ({answer['op']})" if answer.get("op") else where


def _verdict(
    answers: dict[int, dict[str, Any]],
    silent: list[int],
    heard: dict[int, tuple[float, int | None]],
    asked: list[int],
    took: float,
) -> list[str]:
    """What the console says of a hang report: where the stacks are, where the ranks that answered
    wait, and the ranks that are not there (silent, or elsewhere)."""
    from collections import Counter

    from .hang import HANG_DIR

    missing = sorted(set(asked) - set(answers))
    lines = [
        f"ddlkit: stacks of rank(s) {_ranks(sorted(answers))} written to {HANG_DIR}/ in {took:.1f} s"
        + (f"; rank(s) {_ranks(missing)} did not write theirs" if missing else "")
    ]
    places = Counter(_place(a) for a in answers.values())
    common, _ = places.most_common(1)[0]
    waiting = sorted(r for r, a in answers.items() if _place(a) == common)
    steps = {answers[r].get("step") for r in waiting}
    lines.append(
        f"ddlkit: rank(s) {_ranks(waiting)} wait in {common}" + (f" {_at_step(steps.pop())}" if len(steps) == 1 else "")
    )
    for rank in sorted(silent):
        lines.append(
            f"ddlkit: rank {rank} does not answer ({_at_step(heard.get(rank, (0.0, None))[1])} when last heard "
            f"from; stopped, or hung holding the interpreter): it is not in {common} where the others wait; "
            f"its stack, where a rank on its host could read it: {HANG_DIR}/rank-{rank}.txt"
        )
    for rank in sorted(set(answers) - set(waiting)):
        lines.append(
            f"ddlkit: rank {rank} is not where the others wait: it is in {_place(answers[rank])} "
            f"{_at_step(answers[rank].get('step'))} (its stacks: {HANG_DIR}/rank-{rank}.txt)"
        )
    return lines


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"


def _at_step(step: int | None) -> str:
    return "before training started" if step is None else f"at step {step}"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
