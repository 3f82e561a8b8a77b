"""The live progress line of a crawl (rich's :class:`~rich.progress.Progress`), fed by
:func:`redcrawl.workers.run_workers`'s ``progress`` callback."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column

if TYPE_CHECKING:
    from redcrawl.frontier import Counts
    from redcrawl.workers import Tick

__all__ = ["ProgressDisplay"]


@dataclass
class ProgressDisplay:
    """A one-line live display of a crawl (rich's :class:`~rich.progress.Progress`): a bar
    of requests settled (done or dead) out of accepted, then pages, items, queue, in
    flight, retries, dead and the rate of the last 10 seconds. It never wraps: at a
    narrow width the end of the line is cut. Use it as a context manager and pass it as
    :func:`run_workers`'s ``progress``."""

    console: Console
    samples: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.progress = Progress(
            BarColumn(bar_width=12),
            TextColumn(
                "{task.fields[line]}",
                table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1),
            ),
            TimeElapsedColumn(),
            console=self.console,
            refresh_per_second=4,
            transient=False,
            expand=True,
        )
        self.task = self.progress.add_task("crawl", total=None, line="starting workers")

    def __enter__(self) -> ProgressDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    @staticmethod
    def line(c: Counts, stats: Mapping[str, int], rate: float) -> str:
        return (
            f"{c.done:,} pages · {stats.get('items', 0):,} items · "
            f"{c.ready + c.delayed:,} queued · {c.in_flight:,} in flight · "
            f"{c.dead:,} dead · {rate:,.0f}/s · {c.retried:,} retries"
        )

    def __call__(self, tick: Tick) -> None:
        c = tick.counts
        now = tick.elapsed
        self.samples = [(t, d) for t, d in self.samples if now - t < 10] + [(now, c.done)]
        t0, d0 = self.samples[0]
        rate = (c.done - d0) / (now - t0) if now > t0 else 0.0
        self.progress.update(
            self.task,
            total=max(c.accepted, 1),
            completed=c.done + c.dead,
            line=self.line(c, tick.stats, rate),
        )

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """Print above the live line."""
        self.progress.console.print(*objects, **kwargs)
