"""Pipelined settles (:meth:`FrontierCore.settle_begin
<redcrawl.frontier.core.FrontierCore.settle_begin>`): the calls of a frontier's pending
settles go out, in order, on one connection of their own, and their replies are read in
that order too."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.connection
import redis.exceptions

from redcrawl.errors import FrontierError
from redcrawl.frontier.base import Lease, Settled
from redcrawl.transport import NOT_RUN, pool_for

if TYPE_CHECKING:
    from redcrawl.frontier.core import FrontierCore

__all__ = ["PendingSettle"]


class PendingSettle:
    """A :meth:`~redcrawl.frontier.core.FrontierCore.settle` on its way. All of a
    frontier's pending settles go out, in order, on one connection of their own, so Redis
    runs them in the order they were begun (a parent's ack never overtakes its children's
    push), and their replies are read in that order too.

    Each call names the call begun before it (its worker and nonce): if Redis refused
    that one (out of memory, say) and runs this one, this one does not acknowledge its
    parents (their children may have been in the refused call) and hands them back in
    :attr:`Settled.unacked`; so does every later call of the chain, until the refusal has
    been read (:meth:`result`), after which new settles start a new chain."""

    def __init__(
        self, frontier: FrontierCore, calls: list[list[Any]], ack: Sequence[Lease] = ()
    ) -> None:
        self._frontier = frontier
        self.calls = calls
        self.ack = ack
        self.begun = time.monotonic()
        """When it was begun: its calls were sent after this (the leases' ``granted``)."""
        pipe = frontier._pipe
        for args in calls:
            args[9], args[10] = pipe.last
            pipe.last = (args[3], args[8])
        self.replies: list[Any] = []
        self.sent = False
        """Whether the calls went out (else :meth:`result` runs them the ordinary way)."""
        self.waited = frontier.replica_wait is None
        """Whether the replicas are known to have the calls (REDCRAWL_WAIT_REPLICAS)."""
        self.outcome: Settled | None = None
        self.error: BaseException | None = None
        frontier._pipe.send(self)

    def result(self) -> Settled:
        """Wait for the reply (reading those of earlier pending settles first) and return
        what :meth:`~redcrawl.frontier.core.FrontierCore.settle` would have. Raises what it
        raises (an earlier settle's error is kept for that one's own :meth:`result`)."""
        pipe = self._frontier._pipe
        while self.outcome is None and self.error is None:
            oldest = pipe.queue[0]
            try:
                pipe.finish_oldest()
            except BaseException:
                if oldest is self:
                    raise
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome


def _pack(conn: Any, commands: list[tuple[Any, ...]]) -> list[bytes]:
    """``conn.pack_commands(commands)``: straight through hiredis when the connection
    packs with it anyway (redis-py's serializer first copies each argument in a Python
    generator, about as much again as hiredis takes; a settle call has a few arguments
    per request). Anything hiredis refuses (a bool, None, a bytearray) goes redis-py's
    way, which converts it or raises as it always did. Small commands are joined into
    pieces of up to ``_CUTOFF`` bytes and a large one is sent as it is, as redis-py's
    ``pack_commands`` does (no copy of a whole large batch into one)."""
    if _hiredis_pack is not None and type(getattr(conn, "_command_packer", None)) is _Hiredis:
        try:
            packed = [_hiredis_pack(command) for command in commands]
        except TypeError:
            pass
        else:
            out: list[bytes] = []
            pieces: list[bytes] = []
            size = 0
            for chunk in packed:
                if pieces and (size + len(chunk) > _CUTOFF):
                    out.append(b"".join(pieces))
                    pieces, size = [], 0
                if len(chunk) > _CUTOFF:
                    out.append(chunk)
                else:
                    pieces.append(chunk)
                    size += len(chunk)
            if pieces:
                out.append(b"".join(pieces))
            return out
    by_redis_py: list[bytes] = conn.pack_commands(commands)
    return by_redis_py


def _hiredis_packer() -> Any:
    """hiredis's ``pack_command`` when redis-py packs with it (redis-py 5.0 with a hiredis
    before 2.1 has none and uses its Python serializer: so do we), else None."""
    if getattr(redis.connection, "HiredisRespSerializer", None) is None:
        return None
    if not getattr(redis.connection, "HIREDIS_AVAILABLE", False):
        return None
    if not getattr(redis.connection, "HIREDIS_PACK_AVAILABLE", True):
        return None
    try:
        import hiredis
    except ImportError:
        return None
    return getattr(hiredis, "pack_command", None)


_Hiredis: Any = getattr(redis.connection, "HiredisRespSerializer", None)
_hiredis_pack: Any = _hiredis_packer()
_CUTOFF = 6000  # (redis-py's Connection._buffer_cutoff)


class SettlePipe:
    """The connection and queue of a frontier's pending settles."""

    def __init__(self, frontier: FrontierCore) -> None:
        self.frontier = frontier
        self.conn: Any = None
        self.pool: Any = None
        self.broken = False
        self.loaded = False
        self.queue: deque[PendingSettle] = deque()
        self.last: tuple[str, bytes] = ("", b"")
        """Worker and nonce of the last call begun: the next one names it."""

    def send(self, call: PendingSettle) -> None:
        f = self.frontier
        self.queue.append(call)
        if not call.calls or self.broken:
            return
        script, keys = f._scripts["settle"], f._keys
        try:
            if self.conn is None:
                self.pool = pool_for(f.client, keys[0])  # (a cluster: the crawl's master)
                if self.pool is None:
                    return
                self.conn = self.pool.get_connection()
                if not self.loaded:  # so that NOSCRIPT is only ever a server restart
                    f.client.script_load(script.script)
                    self.loaded = True
            commands = [
                ("EVALSHA", script.sha, len(keys), *keys, *f._argv(args)) for args in call.calls
            ]
            self.conn.send_packed_command(_pack(self.conn, commands))
            call.sent = True
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            self._break()

    def finish_oldest(self) -> None:
        call = self.queue[0]
        f = self.frontier
        try:
            if call.sent and not self.broken:
                try:
                    if call.waited:
                        self._read(call)
                    else:
                        self._wait_for_replicas()
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    # what ran is replayed (lease nonce) or deduplicated by the retry
                    for c in self.queue:
                        if not c.waited:  # not known to be on the replicas: replayed
                            c.replies = [r if isinstance(r, Exception) else None for r in c.replies]
                    self._break()
            error = next((r for r in call.replies if isinstance(r, Exception)), None)
            if error is not None:
                raise FrontierError(f"Redis refused settle: {error}") from error
            # whatever did not run, or whose reply was lost, runs now, in order
            replies = [
                r if r is not None else f._run("settle", args)
                for args, r in zip(call.calls, call.replies, strict=False)
            ]
            replies += [f._run("settle", args) for args in call.calls[len(replies) :]]
            call.outcome = f._settled(call.calls, replies, call.ack, call.begun)
        except BaseException as exc:
            call.error = exc
            self.last = ("", b"")  # seen: settles begun from now on start a new chain
            raise
        finally:
            self.queue.popleft()
            if not self.queue:
                self._release()

    def _read(self, call: PendingSettle) -> None:
        """Read the replies of ``call`` (None for a call that did not run)."""
        while len(call.replies) < len(call.calls):
            try:
                reply = self.conn.read_response()
            except NOT_RUN:
                reply = None  # not run (scripts lost, slot moved): run below
            except redis.exceptions.ResponseError as exc:
                reply = exc
            call.replies.append(reply)

    def _wait_for_replicas(self) -> None:
        """REDCRAWL_WAIT_REPLICAS: one WAIT, sent now, after every call sent so far, and
        their replies read, then the WAIT's. It is not sent with each call: a WAIT with
        commands queued behind it on its connection (the next pipelined settle) makes
        Redis run those only at its next event-loop turn (up to 1/hz = 100 ms later)."""
        wait = self.frontier.replica_wait
        assert wait is not None
        covered = [c for c in self.queue if c.sent]
        self.conn.send_packed_command(self.conn.pack_command(*wait.command()))
        for c in covered:
            self._read(c)
        try:
            acked = self.conn.read_response()
        except redis.exceptions.ResponseError as exc:
            acked = exc
        wait.account(acked)
        for c in covered:
            c.waited = True

    def _break(self) -> None:
        """The connection failed: what is still queued runs the ordinary way."""
        self.broken = True
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.disconnect()
            self.pool.release(conn)

    def _release(self) -> None:
        self.broken = False
        conn, self.conn = self.conn, None
        if conn is not None:
            self.pool.release(conn)
