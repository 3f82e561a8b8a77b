"""Checks of the Redis server a crawl runs on, made when a worker or the API starts.

* **Eviction.** With a ``maxmemory-policy`` that can evict frontier keys (any
  ``allkeys-*``, or ``volatile-*`` while fingerprints expire by recrawl window), Redis would
  silently drop requests and fingerprints when memory runs out: refused with a
  :class:`~redcrawl.errors.ConfigError` unless ``REDCRAWL_ALLOW_EVICTION`` is set.
* **Memory.** Used memory past ``REDCRAWL_MEMORY_WARN_RATIO`` of ``maxmemory``: a warning
  (also checked periodically by :class:`MemoryWatch`).
* **Dedupe encoding.** The exact filter's buckets stay under Redis's default
  ``set-max-intset-entries`` (512); crawls created with the legacy plan (buckets of ~2,048)
  need it raised: raised when allowed (``REDCRAWL_CONFIGURE_SERVER``), reported otherwise,
  and buckets that fell back to hash tables are reported.
* **Permissions.** A check whose command the server refuses (an ACL user without
  ``@dangerous`` commands such as INFO and CONFIG, or a renamed command) is skipped with a
  warning naming what was not checked; it never stops a worker or the API from starting.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import redis.exceptions

from redcrawl.errors import ConfigError
from redcrawl.settings import Settings

if TYPE_CHECKING:
    from redcrawl.frontier import FrontierCore

__all__ = ["MemoryWatch", "check_eviction", "check_memory", "check_memory_policy", "check_server"]


class NotAllowed(Exception):
    """The server refused a start check's command (an ACL without it, a renamed command)."""


def _memory_info(client: Any) -> tuple[str, int, int]:
    """maxmemory-policy, maxmemory and used memory, from INFO memory (a cluster: an
    evicting policy if any master has one, the memory of the master nearest its limit). Raises
    :class:`NotAllowed` when the server refuses INFO."""
    try:
        # a Redis Cluster (redcrawl.cluster.ClusterClient): each master's
        infos = (
            list(client.master_infos("memory").values())
            if hasattr(client, "master_infos")
            else [client.info("memory")]
        )
    except redis.exceptions.ResponseError as exc:  # NoPermissionError, unknown command
        raise NotAllowed(str(exc)) from None
    policies = [str(i.get("maxmemory_policy", "noeviction")) for i in infos]
    fullest = max(
        infos, key=lambda i: int(i.get("used_memory", 0)) / (int(i.get("maxmemory", 0)) or 1e30)
    )
    return (
        next((p for p in policies if p != "noeviction"), "noeviction"),  # one evicting master
        int(fullest.get("maxmemory", 0)),
        int(fullest.get("used_memory", 0)),
    )


def _not_checked(reason: str) -> str:
    return (
        f"could not check the Redis server's eviction policy and memory use: INFO is "
        f"not allowed for this connection ({reason}). Nothing protects the crawl from "
        f"eviction or a full server: make sure maxmemory-policy is noeviction and watch "
        f"memory yourself, or allow the command to redcrawl's ACL user (ACL SETUSER "
        f"<user> +info)"
    )


def check_eviction(settings: Settings, policy: str, maxmemory: int) -> str | None:
    """Raise :class:`ConfigError` if ``policy`` can evict frontier keys (unless allowed);
    returns a warning for a policy that would once a maxmemory is set."""
    ttl_keys = settings.recrawl_after > 0
    evicts = policy.startswith("allkeys-") or (policy.startswith("volatile-") and ttl_keys)
    if not evicts:
        return None
    what = (
        "evicts any key"
        if policy.startswith("allkeys-")
        else "evicts keys with a TTL, and the crawl's DONE fingerprints expire by recrawl "
        "window (REDCRAWL_RECRAWL_AFTER)"
    )
    message = (
        f"the Redis server's maxmemory-policy is {policy}, which {what}: when memory "
        f"runs out, requests and fingerprints would vanish without an error. Set "
        f"maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction) and give "
        f"Redis enough memory, or set REDCRAWL_ALLOW_EVICTION=true to run anyway"
    )
    if maxmemory == 0:
        return message.replace("when memory runs out", "once a maxmemory is set")
    if settings.allow_eviction:
        return message.replace(
            ", or set REDCRAWL_ALLOW_EVICTION=true to run anyway",
            " (running anyway: REDCRAWL_ALLOW_EVICTION is set)",
        )
    raise ConfigError("REDCRAWL_ALLOW_EVICTION", message)


def check_memory(settings: Settings, maxmemory: int, used: int) -> str | None:
    """A warning when used memory is past the warning ratio of maxmemory."""
    if maxmemory <= 0 or used < settings.memory_warn_ratio * maxmemory:
        return None
    return (
        f"Redis uses {used / 2**20:.0f} MiB of its maxmemory {maxmemory / 2**20:.0f} MiB "
        f"({used / maxmemory:.0%}, warning at {settings.memory_warn_ratio:.0%}); at the "
        f"limit writes fail (noeviction) and workers stop. Raise maxmemory, or use "
        f"REDCRAWL_DEDUPE=bloom for a smaller fingerprint filter"
    )


def memory_warning(client: Any, settings: Settings) -> str | None:
    """:func:`check_memory` of the server now (None when INFO is not allowed): for an
    operator's ``status``, which must work most when Redis is full."""
    try:
        _policy, maxmemory, used = _memory_info(client)
    except NotAllowed:
        return None
    return check_memory(settings, maxmemory, used)


def check_memory_policy(client: Any, settings: Settings) -> list[str]:
    """The server-wide checks (eviction policy, memory use): raises :class:`ConfigError`
    for an evicting server; returns warnings to log."""
    try:
        policy, maxmemory, used = _memory_info(client)
    except NotAllowed as exc:
        return [_not_checked(str(exc))]
    warnings = [
        check_eviction(settings, policy, maxmemory),
        check_memory(settings, maxmemory, used),
    ]
    return [w for w in warnings if w]


def check_server(frontier: FrontierCore) -> list[str]:
    """Every start-time check for a crawl's frontier: :func:`check_memory_policy`, then the
    dedupe filter's server limits and encoding. Returns warnings to log."""
    settings = frontier.settings
    warnings: list[str | None] = [*check_memory_policy(frontier.client, settings)]
    if settings.configure_server:
        warnings.append(frontier.done.configure())
    warnings += frontier.done.health()
    return [w for w in warnings if w]


class MemoryWatch:
    """Warns at most once per ``interval`` seconds while memory stays past the ratio."""

    def __init__(self, client: Any, settings: Settings, interval: float = 60.0) -> None:
        self.client = client
        self.settings = settings
        self.interval = interval
        self._next = 0.0

    def check(self) -> str | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.interval
        try:
            _policy, maxmemory, used = _memory_info(self.client)
        except NotAllowed:
            self._next = math.inf  # said at start (check_memory_policy); stop asking
            return None
        return check_memory(self.settings, maxmemory, used)
