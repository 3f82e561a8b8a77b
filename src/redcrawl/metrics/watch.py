"""The watchdog (``redcrawl watch --webhook URL``): polls Redis, evaluates the alert rules
(:mod:`.rules`) and POSTs each transition — firing, then resolved — once, as JSON with a
Slack-compatible ``text`` field::

    {"status": "firing", "alert": "RedcrawlCrawlStalled", "labels": {"crawl": "shop"},
     "summary": "...", "since": 1764583200.0, "text": "[FIRING] RedcrawlCrawlStalled ..."}

Notifications wait in an outbox until the webhook accepts them (any 2xx), in order, and
are retried at every poll; the outbox keeps the newest ``outbox_limit`` (older ones are
dropped with a warning). Nothing a webhook or Redis does stops the loop: errors are
logged and the next poll goes on.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redcrawl.metrics.rules import Finding, History, Labels, Thresholds, rules, window
from redcrawl.metrics.snapshot import SnapshotReader

__all__ = ["Notification", "Watchdog", "webhook_site"]

log = logging.getLogger(__name__)


def webhook_site(url: str) -> str:
    """``scheme://host[:port]/...`` of ``url``, for logs: never its path (often its secret:
    Slack's incoming webhooks), user info, query or fragment, whatever the path."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "the webhook"
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    return f"{parts.scheme}://{host}{'' if port is None else f':{port}'}/..."


@dataclass(frozen=True, slots=True)
class Notification:
    status: str
    """``firing`` or ``resolved``."""
    alert: str
    labels: Labels
    summary: str
    since: float

    def payload(self) -> dict[str, Any]:
        where = " ".join(f"{k}={v}" for k, v in self.labels)
        return {
            "status": self.status,
            "alert": self.alert,
            "labels": dict(self.labels),
            "summary": self.summary,
            "since": self.since,
            "text": f"[{self.status.upper()}] {self.alert}"
            + (f" {where}" if where else "")
            + f": {self.summary}",
        }


class Watchdog:
    """Evaluate the rules on each :meth:`poll`; deliver transitions to ``webhook``."""

    def __init__(
        self,
        reader: SnapshotReader,
        webhook: str,
        *,
        thresholds: Thresholds | None = None,
        timeout: float = 5.0,
        outbox_limit: int = 1000,
        echo: Callable[[Notification], None] | None = None,
    ) -> None:
        self.reader = reader
        self.webhook = webhook
        self.thresholds = thresholds or Thresholds()
        self.rules = rules(self.thresholds)
        self.history = History(window(self.thresholds))
        self.timeout = timeout
        self.outbox: deque[Notification] = deque(maxlen=outbox_limit)
        self.echo = echo
        self.pending: dict[tuple[str, Labels], float] = {}
        """Conditions holding, and since when (server time), not yet for long enough."""
        self.firing: dict[tuple[str, Labels], Notification] = {}

    def poll(self) -> None:
        """One round: read, evaluate, queue transitions, deliver. Never raises."""
        try:
            self._evaluate()
        except Exception as exc:
            log.warning("watch: could not evaluate the rules (%s); trying again", exc)
        self.deliver()

    def _evaluate(self) -> None:
        snap = self.reader.read()
        self.history.add(snap)
        holding: dict[tuple[str, Labels], Finding] = {}
        for rule in self.rules:
            for f in rule.evaluate(snap, self.history, self.thresholds):
                holding[(rule.name, f.labels)] = f
        for key in list(self.pending):
            if key not in holding:
                del self.pending[key]
        for key, f in holding.items():
            since = self.pending.setdefault(key, snap.now)
            rule_for = next(r.for_ for r in self.rules if r.name == key[0])
            if key not in self.firing and snap.now - since >= rule_for:
                note = Notification("firing", key[0], key[1], f.summary, since)
                self.firing[key] = note
                self._queue(note)
        for key in [k for k in self.firing if k not in holding]:
            was = self.firing.pop(key)
            self._queue(
                Notification(
                    "resolved", was.alert, was.labels, f"resolved (was: {was.summary})", snap.now
                )
            )

    def _queue(self, note: Notification) -> None:
        if len(self.outbox) == self.outbox.maxlen:
            log.warning("watch: outbox full, dropping the oldest notification")
        self.outbox.append(note)
        if self.echo is not None:
            self.echo(note)

    def deliver(self) -> int:
        """Send the outbox in order until the webhook refuses one; returns how many went."""
        sent = 0
        while self.outbox:
            note = self.outbox[0]
            body = json.dumps(note.payload()).encode()
            req = urllib.request.Request(
                self.webhook, data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    resp.read()
            except (urllib.error.URLError, OSError, ValueError) as exc:
                log.warning(
                    "watch: webhook %s did not take the notification (%s); "
                    "%d waiting, retried at the next poll",
                    webhook_site(self.webhook),
                    exc,
                    len(self.outbox),
                )
                return sent
            self.outbox.popleft()
            sent += 1
        return sent

    def run(self, interval: float, *, polls: int | None = None) -> None:
        """Poll every ``interval`` seconds (``polls`` times, or until interrupted)."""
        n = 0
        while polls is None or n < polls:
            started = time.monotonic()
            self.poll()
            n += 1
            if polls is None or n < polls:
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
