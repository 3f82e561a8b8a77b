"""``redcrawl top``: a live terminal view of one crawl, drawn with rich from the same
snapshot the exporter reads (:mod:`.snapshot`), plus, for a crawl with fleet-wide
politeness, its top hosts (:mod:`.hosts_view`, bounded like ``redcrawl hosts``) and its
most recent dead letters. Text from Redis (worker ids, keys, errors) is shown as plain
text, never as rich markup."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from redcrawl.frontier import FrontierCore
from redcrawl.frontier.base import format_id
from redcrawl.frontier.partitioned import PartitionedFrontier, _wrap_text
from redcrawl.metrics.hosts_view import TOP_HOSTS, HostsPanel, read_hosts
from redcrawl.metrics.snapshot import CrawlSnapshot, SnapshotReader
from redcrawl.politeness.hosts import Sort

__all__ = ["HOSTS_EVERY", "Top", "hosts_table"]

HOSTS_EVERY = 5.0
"""Seconds between two reads of ``redcrawl top``'s hosts panel."""


class Top:
    """Frames of one crawl; rates are per second between two frames."""

    def __init__(
        self,
        reader: SnapshotReader,
        crawl: str,
        *,
        dead_rows: int = 5,
        hosts: int = TOP_HOSTS,
        hosts_sort: Sort = "ready",
        hosts_every: float = HOSTS_EVERY,
    ) -> None:
        self.reader = reader
        self.crawl = crawl
        self.dead_rows = dead_rows
        self.hosts = hosts
        """Politeness keys shown (0: no hosts panel)."""
        self.hosts_sort: Sort = hosts_sort
        self.hosts_every = hosts_every
        """Seconds between two reads of the hosts panel (frames in between show the last)."""
        self._panel: tuple[float, HostsPanel | None] | None = None
        self.last: CrawlSnapshot | None = None

    def snapshot(self) -> CrawlSnapshot | None:
        """The crawl now, or None if its state could not be read (logged)."""
        snap = self.reader.read()
        for c in snap.crawls:
            if c.crawl == self.crawl:
                return c
        return None

    def _recent_dead(self, f: FrontierCore) -> list[tuple[str, str]]:
        """The crawl's most recent dead requests and their errors (a partitioned crawl's
        over every partition: two pipelined rounds)."""
        client: Any = f.client
        subs = list(f.parts) if isinstance(f, PartitionedFrontier) else [f]
        pipe = client.pipeline(transaction=False)
        for sub in subs:
            pipe.zrevrange(sub.keys.dead, 0, self.dead_rows - 1, withscores=True)
        latest = sorted(
            ((score, p, i) for p, rows in enumerate(pipe.execute()) for i, score in rows),
            key=lambda x: -x[0],
        )[: self.dead_rows]
        if not latest:
            return []
        pipe = client.pipeline(transaction=False)
        for _score, p, i in latest:
            pipe.hget(subs[p].keys.err, i)
        errs = pipe.execute()
        return [
            (
                _wrap_text(p, format_id(i)) if len(subs) > 1 else format_id(i),
                (e or b"").decode(errors="replace"),
            )
            for (_score, p, i), e in zip(latest, errs, strict=True)
        ]

    def frame(self) -> RenderableType:
        c = self.snapshot()
        if c is None:
            return Text(
                f"crawl {self.crawl}: its state could not be read (corrupt? see "
                "`redcrawl status`); trying again",
                style="bold red",
            )
        prev, self.last = self.last, c
        dt = c.now - prev.now if prev is not None else 0.0

        def rate(now: int, before: int | None) -> str:
            return f"{(now - before) / dt:,.1f}/s" if dt > 0 and before is not None else "-"

        n = c.counts
        states = Table(
            title=f"crawl {c.crawl} ({c.backend}"
            + (", paused" if c.paused else "")
            + (f", DAMAGED: {c.lost_partitions} partition(s) lost" if c.lost_partitions else "")
            + (", finished" if n.finished and n.accepted and not c.lost_partitions else "")
            + ")"
        )
        for col in (
            "ready",
            "delayed",
            "in flight",
            "done",
            "dead",
            "accepted",
            "dupes",
            "done/s",
            "new/s",
        ):
            states.add_column(col, justify="right", no_wrap=True)
        pn = prev.counts if prev is not None else None
        states.add_row(
            *(
                f"{v:,}"
                for v in (n.ready, n.delayed, n.in_flight, n.done, n.dead, n.accepted, n.filtered)
            ),
            rate(n.done, pn.done if pn else None),
            rate(n.accepted, pn.accepted if pn else None),
        )
        workers = Table(title=f"workers: {c.workers_alive} alive of {c.workers_known}")
        workers.add_column("worker")
        workers.add_column("heartbeat age", justify="right")
        workers.add_column("state")
        for w in c.workers:
            workers.add_row(Text(w.worker), f"{w.age:.1f}s", "alive" if w.alive else "lost")
        f = self.reader.frontier(c.crawl)
        parts: list[RenderableType] = [states, workers]
        if self.hosts > 0:
            panel = self._hosts(f)
            if panel is not None:
                parts.append(hosts_table(panel, c.open_keys))
        dead = Table(title="recent dead letters")
        dead.add_column("id")
        dead.add_column("last error")
        for rid, err in self._recent_dead(f):
            dead.add_row(rid, Text(err[:120]))
        parts.append(dead)
        return Group(*parts)

    def _hosts(self, f: FrontierCore) -> HostsPanel | None:
        """The hosts panel, read again once :attr:`hosts_every` seconds have passed (a
        read costs more than the rest of a frame: tens of ms of Redis time at 100,000
        keys with ready work)."""
        now = time.monotonic()
        if self._panel is None or now - self._panel[0] >= self.hosts_every:
            self._panel = (now, read_hosts(f, limit=self.hosts, sort=self.hosts_sort))
        return self._panel[1]

    def once(self, console: Console) -> None:
        console.print(self.frame())

    def run(self, console: Console, interval: float) -> None:
        """Redraw every ``interval`` seconds until interrupted (KeyboardInterrupt is the
        caller's to catch)."""
        with Live(self.frame(), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(self.frame(), refresh=True)


def _seconds(x: float) -> str:
    return f"{x:g} s"


def hosts_table(panel: HostsPanel, open_keys: int | None = None) -> Table:
    """The hosts panel as a rich table (keys and reasons as plain text)."""
    by = "ready" if panel.sort == "ready" else "in flight"
    seen = f"{len(panel.hosts)} of {panel.scanned:,}" + ("" if panel.complete else "+")
    title = f"hosts: top {seen} by {by}" + (
        f", {open_keys:,} open now" if open_keys is not None else ""
    )
    t = Table(title=title)
    for col, right in (
        ("key", False),
        ("ready", True),
        ("in flight", True),
        ("delay", True),
        ("conc.", True),
        ("blocked until (UTC)", False),
        ("why not served now", False),
    ):
        t.add_column(col, justify="right" if right else "left", no_wrap=col == "key")
    for h in panel.hosts:
        blocked = (
            time.strftime("%H:%M:%S", time.gmtime(h.blocked_until))
            if h.blocked_until is not None
            else ""
        )
        t.add_row(
            Text(h.key[:60] + ("…" if len(h.key) > 60 else "")),
            f"{h.ready:,}",
            f"{h.in_flight:,}",
            _seconds(h.delay) if h.delay is not None else "?",
            f"{h.concurrency:,}" if h.concurrency is not None else "?",
            blocked,
            Text(h.why if h.why is not None else "open: the next lease takes it"),
        )
    if not panel.hosts:
        t.add_row(Text("(no key with ready work or in flight)"), "", "", "", "", "", "")
    return t
