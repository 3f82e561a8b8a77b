"""The frontier's fleet-wide politeness operations (docs/politeness.md):
:class:`PolitenessOps`, a base of :class:`~redcrawl.frontier.core.FrontierCore`. The
crawl's limits stored for the lease step, a slot given back at response time, a start
charged after a wait, a 429/503 deferral, the crawl-wide politeness figures. Each is one
script of ``lua/`` (through ``FrontierCore._run``) or a bounded read; without politeness
(crawls created without it) they do nothing, or refuse. Both backends keep the per-key
queues and state in ``lua/polite.lua``; what their Python sides share is here too.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from redcrawl.errors import ConfigError, FrontierError
from redcrawl.frontier.base import Lease
from redcrawl.frontier.records import stored_int, stored_layout
from redcrawl.keys import CrawlKeys
from redcrawl.politeness import BackoffPolicy
from redcrawl.settings import Settings
from redcrawl.transport import redis_errors

__all__ = ["PolitenessOps", "backoff_field", "slot_outcome"]

log = logging.getLogger("redcrawl.frontier.core")


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def backoff_field(policy: BackoffPolicy) -> str:
    """The crawl's control field ``backoff``: the JSON the Lua steps read the 429/503
    backoff from (``backoff_policy`` in ``lua/queue_lists.lua``; a missing or unreadable
    field means :class:`BackoffPolicy`'s defaults there). ``retry_after_cap`` is not in
    it: workers apply that cap when they parse a ``Retry-After``."""
    return json.dumps(
        {
            "base": policy.base,
            "cap": policy.cap,
            "jitter": policy.jitter,
            "forgive_after": policy.forgive_after,
        },
        sort_keys=True,
    )


def slot_outcome(
    status: int | None, *, pushed_back: bool = False, retry_after: float | None = None
) -> str:
    """The outcome of a request whose slot goes back at response time
    (:meth:`FrontierCore.free`): ``status`` None for a download error ("e"); a site
    pushing back that is not deferred (``pushed_back``: a 429/503 the spider handles
    itself) blocks the key ("f<ms>" with its ``retry_after`` in seconds, "f" for the
    backoff delay); any other response is a success ("s", which wears a backoff down)."""
    if status is None:
        return "e"
    if pushed_back:
        return "f" if retry_after is None else f"f{max(int(retry_after * 1000), 0)}"
    return "s"


class PolitenessOps:
    """Fleet-wide politeness, as operations of the frontier (a base of ``FrontierCore``,
    which provides what is declared here)."""

    client: Any
    settings: Settings
    keys: CrawlKeys
    crawl: str
    politeness: str | None
    _clock: Callable[[], int] | None
    _pol_stored: bool

    def _run(self, name: str, args: Sequence[Any], client: Any = None) -> Any:
        raise NotImplementedError  # FrontierCore's

    def _nonce(self, worker: str) -> bytes:
        raise NotImplementedError  # FrontierCore's

    # --- shared by the queue layers (lists, streams) -------------------------------
    def _stored_politeness_mode(self, plain: str) -> str | None:
        """The key mode if this crawl has politeness: asked for by the settings and the
        crawl is new or was created with it (its stored layout ends in the key mode:
        "fifo/host", "streams/8/host"). A crawl whose stored layout is ``plain`` (this
        worker's layout without politeness: "fifo", "streams/4") keeps it, with a warning;
        any other layout is the layout check's to refuse, naming both."""
        if not self.settings.politeness:
            return None
        with redis_errors("reading the crawl layout"):
            raw = stored_layout(self.client.hgetall(self.keys.control))
        if raw is None:
            return self.settings.politeness_key
        head = raw.decode(errors="replace").split(" ", 1)[0]
        if head != plain:  # created with politeness, or a layout this worker refuses
            return self.settings.politeness_key
        log.warning(
            "crawl %s was created without fleet-wide politeness and keeps its "
            "layout: each worker limits itself (purge the crawl, or use a new "
            "crawl name, to have the frontier enforce the limits)",
            self.crawl,
        )
        return None

    def _pol_ready_ids(self, limit: int, ordering: str) -> Iterator[tuple[int, list[bytes]]]:
        """Ready ids in the per-key queues (``ordering``: theirs), key by key, in the order
        the keys open, within each tier."""
        base = self.keys.pol_queue_base
        for t in range(self.keys.tiers):
            got = 0
            for key in self.client.zrange(self.keys.open(t), 0, limit - 1):
                q = f"{base}{t}:".encode() + key
                if ordering == "priority":
                    ids = self.client.zrange(q, 0, limit - got - 1)
                elif ordering == "fifo":
                    ids = self.client.lrange(q, -(limit - got), -1)[::-1]
                else:
                    ids = self.client.lrange(q, 0, limit - got - 1)
                got += len(ids)
                yield t, ids
                if got >= limit:
                    break

    def _purge_politeness(self) -> None:
        """The per-key politeness queues and states, found by SCAN, deleted in batches
        (purge, after its script: there may be too many for one script call)."""
        for pattern in self.keys.pol_patterns():
            batch: list[bytes] = []
            for key in self.client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    self.client.unlink(*batch)
                    batch = []
            if batch:
                self.client.unlink(*batch)

    def store_politeness(self, *, worker: bool = False) -> None:
        """Store the crawl's default limits and per-key settings (DOWNLOAD_SLOTS) from
        this frontier's settings. A Scrapy worker (``worker``) sets them, the spider's
        settings being the fleet's (the latest worker wins; a change from another worker's
        is logged); other users (API, CLI, tools) only when the crawl has none yet, and
        they mark them as theirs (control ``politeness_tool``), so that the first worker
        replaces them without a warning."""
        s = self.settings
        conc = s.politeness_concurrency_per_ip or s.politeness_concurrency
        mine = json.dumps(
            {
                "concurrency": conc,
                "delay": s.politeness_delay,
                "randomize": s.politeness_randomize,
                "jitter": s.politeness_jitter,
            },
            sort_keys=True,
        )
        slots: dict[str, str] = {}
        for key, value in s.politeness_slots.items():
            if not isinstance(value, Mapping):
                raise ConfigError(
                    "DOWNLOAD_SLOTS",
                    f"the entry {key!r} is {value!r}; give a "
                    'mapping like {"concurrency": 1, "delay": 2.0}',
                )
            slots[str(key)] = json.dumps(
                {
                    k: value[k]
                    for k in ("concurrency", "delay", "randomize_delay", "jitter")
                    if k in value
                }
            )
        self._pol_stored = True
        backoff = backoff_field(s.backoff_policy)
        with redis_errors("storing the crawl's politeness settings"):
            pipe = self.client.pipeline(transaction=True)
            pipe.hget(self.keys.control, "politeness")
            # the 429/503 backoff (REDCRAWL_BACKOFF_*): read by the Lua steps at each
            # failure and success, so a worker's change counts from the next one
            pipe.hget(self.keys.control, "backoff")
            # the defaults a tool stored (`redcrawl seed` before any worker: from the
            # project's settings, without a spider's custom_settings), not a worker's
            pipe.hget(self.keys.control, "politeness_tool")
            if worker:
                pipe.hset(self.keys.control, "backoff", backoff)
            else:
                pipe.hsetnx(self.keys.control, "backoff", backoff)
            if worker:
                pipe.hset(self.keys.control, "politeness", mine)
                pipe.hdel(self.keys.control, "politeness_tool")
                # (a Scrapy worker gives back a request it could not start within this
                # window: grants of a key with a delay are spaced by delay + window)
                pipe.hset(
                    self.keys.control,
                    "start_window",
                    int(1000 * s.politeness_start_window),
                )
            else:
                pipe.hsetnx(self.keys.control, "politeness", mine)
            if slots and worker:
                pipe.hset(self.keys.pol_slots, mapping=slots)
            stored, stored_backoff, by_tool = pipe.execute()[:3]
            if not worker and stored is None:
                self.client.hset(self.keys.control, "politeness_tool", mine)
                if slots:
                    self.client.hset(self.keys.pol_slots, mapping=slots)
        if worker:
            self._drop_legacy_once()
        if (
            worker
            and stored_backoff is not None
            and _json_or_none(stored_backoff) != json.loads(backoff)
        ):
            log.warning(
                "crawl %s: the fleet-wide 429/503 backoff changes from %s to this worker's "
                "%s (give every worker the same REDCRAWL_BACKOFF_BASE, _CAP, _JITTER and "
                "_FORGIVE_AFTER); it counts from each site's next failure or success",
                self.crawl,
                stored_backoff.decode(errors="replace"),
                backoff,
            )
        if (
            worker
            and stored is not None
            and stored != by_tool  # (a tool's defaults: this worker's are the first)
            and stored.decode(errors="replace") != mine
        ):
            log.warning(
                "crawl %s: the fleet-wide politeness defaults change from %s to this "
                "worker's %s (give every worker the same CONCURRENT_REQUESTS_PER_DOMAIN, "
                "DOWNLOAD_DELAY and RANDOMIZE_DOWNLOAD_DELAY)",
                self.crawl,
                stored.decode(errors="replace"),
                mine,
            )

    def drop_legacy_auto_delay(self, *, batch: int = 500) -> int:
        """Remove ``auto_delay`` from the crawl's per-key overrides (``rc:{C}:polo``):
        AutoThrottle's delay of a crawl created before it moved into the key's state
        (``ad``). Nothing reads it any more (a site's AutoThrottle delay starts again
        from the start delay, as after an hour idle), but it never expires and makes
        every grant read the override hash. One script call per ``batch`` entries
        scanned (``HSCAN``), each atomic; safe to run while the crawl runs, and again.
        Each Scrapy worker runs it at start on a crawl not yet cleaned (a control field
        marks it done). Returns how many entries were changed (0 without politeness)."""
        if self.politeness is None:
            return 0
        cursor, changed = b"0", 0
        while True:
            cursor, n = self._run("drop_auto_delay", [cursor, batch])
            changed += int(n)
            if bytes(cursor) == b"0":
                return changed

    def _drop_legacy_once(self) -> None:
        """:meth:`drop_legacy_auto_delay` once per crawl (control field
        ``auto_delay_dropped``), logged when it changed anything."""
        with redis_errors("reading the crawl's control hash"):
            if self.client.hexists(self.keys.control, "auto_delay_dropped"):
                return
        changed = self.drop_legacy_auto_delay()
        with redis_errors("marking the crawl's overrides cleaned"):
            self.client.hset(self.keys.control, "auto_delay_dropped", changed)
        if changed:
            log.info(
                "crawl %s: dropped AutoThrottle's auto_delay from %d per-site overrides "
                "(kept there by an older redcrawl; AutoThrottle's delay is now in each "
                "site's state, and these sites start again from AUTOTHROTTLE_START_DELAY)",
                self.crawl,
                changed,
            )

    def free(self, items: Sequence[tuple[Lease, str]]) -> int:
        """Give back the politeness slots of leased requests whose response (or download
        error) has arrived: their keys may be granted again at once, while the requests
        stay IN-FLIGHT under their leases until acked (or nacked, released, reclaimed:
        none of which gives the slot back a second time). Each item is a lease and its
        outcome (:func:`slot_outcome`). Returns how many slots went back (0 without
        politeness; a stale lease or one already freed is skipped)."""
        if self.politeness is None or not items:
            return 0
        args: list[Any] = []
        for lease, outcome in items:
            args += (lease.id, lease.token, outcome)
        return int(self._run("free", args))

    def charge_fetch(self, keys: Sequence[str]) -> None:
        """A fetch starts now at each key's site that no grant accounted for (a
        robots.txt download): the key's next grant waits its delay from now. Nothing
        without politeness."""
        if self.politeness is None or not keys:
            return
        args: list[Any] = []
        for key in keys:
            args += ("r", key, "")
        self._run("charge", args)

    def block_site(self, key: str, retry_after: float | None) -> None:
        """The key's site pushed back outside any lease (its robots.txt answered 429/503):
        the key is blocked for the fleet for ``retry_after`` seconds (its Retry-After) or,
        without one, for the backoff of its failure count, as a deferral blocks it.
        Nothing without politeness."""
        if self.politeness is None:
            return
        ms = "" if retry_after is None else str(max(int(retry_after * 1000), 0))
        self._run("charge", ["b", key, ms])

    def start_late(self, leases: Sequence[Lease]) -> list[bool]:
        """Granted requests that waited in their worker (for robots.txt) past their start
        window ask to start now: True for each that may (its start is charged: its key's
        next grant waits its delay from now), False for each that must be given back
        (:meth:`release`) because another start at its site came after its grant, within
        its delay (docs/politeness.md, "Starts after a wait"); False too for a lease no
        longer held (the fleet took it back: another worker may hold the request now).
        Without politeness, True (nothing to space)."""
        if self.politeness is None or not leases:
            return [True] * len(leases)
        args: list[Any] = []
        for lease in leases:
            args += ("s", lease.id, lease.token)
        flags = bytes(self._run("charge", args)).decode()
        return [f not in "0n" for f in flags]

    def retry_start(
        self, leases: Sequence[Lease], check: Sequence[bool] = ()
    ) -> list[float | None]:
        """Held requests that Scrapy's RetryMiddleware fetches again (their lease and slot
        kept): a start is reserved for each at its key's site, a delay after the key's
        last start and grant, and the key's next grant waits a delay after it
        (``lua/retry_start.lua``); ``check[i]`` true: the start reserved before for
        ``leases[i]`` has come, nothing is reserved (0, or ``inf`` if its key was paused
        or blocked meanwhile). Returns the seconds each must wait before it starts (0:
        now), ``math.inf`` for one to give back (:meth:`release`; served when its key
        opens again): its key is paused or blocked, or its slot went back with its
        response (a retry made in a callback), or None for one no longer held (and for
        every one without politeness: nothing to space)."""
        if self.politeness is None or not leases:
            return [None] * len(leases)
        args: list[Any] = []
        for i, lease in enumerate(leases):
            args += (lease.id, lease.token, "c" if i < len(check) and check[i] else "r")
        waits = [int(w) for w in self._run("retry_start", args)]
        return [None if w == -1 else math.inf if w == -2 else w / 1000 for w in waits]

    def defer(self, lease: Lease, reason: str, *, retry_after: float | None = None) -> str:
        """The site pushed back (HTTP 429/503; ``reason`` is the status): the request goes
        back to the front of its politeness key's queue without spending an attempt,
        and its key is blocked for the whole fleet for ``retry_after`` seconds (the
        response's ``Retry-After``) or, without it, for the backoff delay of the key's
        failures (:class:`~redcrawl.politeness.BackoffPolicy`). After
        ``REDCRAWL_MAX_DEFERRALS`` deferrals it goes to DEAD with the reason. Returns
        "deferred", "dead" or "stale" (no longer held under this lease). Crawls with
        politeness only (a :class:`FrontierError` otherwise)."""
        if self.politeness is None:
            raise FrontierError(
                f"crawl {self.crawl!r} has no fleet-wide politeness: nothing to defer "
                "to (nack the request instead, or use a crawl with REDCRAWL_POLITENESS "
                "on the lists backend)"
            )
        ms = "" if retry_after is None else str(max(int(retry_after * 1000), 0))
        args: list[Any] = [
            self.settings.max_deferrals,
            lease.worker,
            self._nonce(lease.worker),
            lease.id,
            lease.token,
            reason,
            ms,
        ]
        flag = bytes(self._run("defer", args)).decode()
        return {"q": "deferred", "d": "dead"}.get(flag, "stale")

    def politeness_stats(self) -> dict[str, int]:
        """Crawl-wide politeness counters (crawls with politeness; empty otherwise):
        ``blocked`` keys blocked now by a 429/503, ``deferred_<reason>`` deferrals per
        reason (``deferred_429``, ``deferred_503``), ``politeness_wait_ms`` the time keys
        with ready work spent closed by their limits (summed over grants: from when a key
        had work waiting, i.e. its previous grant or the arrival of work at a key that had
        none, to when its delay, concurrency or block let it open; docs/politeness.md)."""
        if self.politeness is None:
            return {}
        with redis_errors("politeness_stats"):
            pipe = self.client.pipeline(transaction=False)  # (a MULTI fails out of memory)
            pipe.time()
            pipe.hgetall(self.keys.stats)
            (sec, usec), raw = pipe.execute()
            now = sec * 1000 + usec // 1000 if self._clock is None else int(self._clock())
            blocked = self.client.zcount(self.keys.pol_blocked, f"({now}", "+inf")
        out = {"blocked": int(blocked), "politeness_wait_ms": 0}
        for k, v in raw.items():
            name = k.decode(errors="replace")
            value = stored_int(v)
            if value is not None and (name.startswith("deferred_") or name == "politeness_wait_ms"):
                out[name] = value
        return out

    def next_open(self) -> float | None:
        """Seconds until the first politeness key with ready work opens (0 if one is open
        now), on the server's clock; None without politeness or when every key with ready
        work has all its slots taken (an ack opens it)."""
        if self.politeness is None:
            return None
        with redis_errors("next_open"):
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            for t in range(self.keys.tiers):
                pipe.zrange(self.keys.open(t), 0, 0, withscores=True)
            (sec, usec), *heads = pipe.execute()
        now = sec * 1000 + usec / 1000 if self._clock is None else self._clock()
        scores = [h[0][1] for h in heads if h and h[0][1] < 2**52]
        return max(min(scores) - now, 0.0) / 1000 if scores else None
