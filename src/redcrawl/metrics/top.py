"""``redcrawl top``: a live terminal view of one crawl, drawn with rich from the same
snapshot the exporter reads (:mod:`.snapshot`), plus its most recent dead letters."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from redcrawl.frontier import FrontierCore
from redcrawl.frontier.base import format_id
from redcrawl.metrics.snapshot import CrawlSnapshot, SnapshotReader

__all__ = ["Top"]


class Top:
    """Frames of one crawl; rates are per second between two frames."""

    def __init__(self, reader: SnapshotReader, crawl: str, *, dead_rows: int = 5) -> None:
        self.reader = reader
        self.crawl = crawl
        self.dead_rows = dead_rows
        self.last: CrawlSnapshot | None = None

    def snapshot(self) -> CrawlSnapshot | None:
        """The crawl now, or None if its state could not be read (logged)."""
        snap = self.reader.read()
        for c in snap.crawls:
            if c.crawl == self.crawl:
                return c
        return None

    def _recent_dead(self, f: FrontierCore) -> list[tuple[str, str]]:
        client: Any = f.client
        ids = client.zrevrange(f.keys.dead, 0, self.dead_rows - 1)
        errs = client.hmget(f.keys.err, ids) if ids else []
        return [
            (format_id(i), (e or b"").decode(errors="replace"))
            for i, e in zip(ids, errs, strict=True)
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
            + (", finished" if n.finished and n.accepted else "")
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
            workers.add_row(w.worker, f"{w.age:.1f}s", "alive" if w.alive else "lost")
        dead = Table(title="recent dead letters")
        dead.add_column("id")
        dead.add_column("last error")
        for rid, err in self._recent_dead(self.reader.frontier(c.crawl)):
            dead.add_row(rid, err[:120])
        return Group(states, workers, dead)

    def once(self, console: Console) -> None:
        console.print(self.frame())

    def run(self, console: Console, interval: float) -> None:
        """Redraw every ``interval`` seconds until interrupted (KeyboardInterrupt is the
        caller's to catch)."""
        with Live(self.frame(), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(self.frame(), refresh=True)
