"""What the tests of partitioned crawls share (tests/test_partitions*.py): host names of a
given partition and their requests, a partitioned frontier, a crawl with fleet-wide
politeness on the test clock, and everything a crawl grants now. The Redis client they
use is conftest's (``redis7_client``, or ``cluster_client`` on the cluster)."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import redis
from hypothesis import HealthCheck
from hypothesis import settings as hsettings

from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore, Lease, PartitionedFrontier, open_frontier
from redcrawl.keys import partition_of
from redcrawl.settings import Settings

from .conftest import Clock
from .test_frontier_properties import FrontierMachine

__all__ = [
    "envs",
    "hosts",
    "hosts_in",
    "lease_all",
    "open_partitioned",
    "polite_crawl",
    "run_machine",
    "site",
]


def hosts_in(partition: int, partitions: int, count: int, prefix: str = "h") -> list[str]:
    """``count`` host names whose partition is ``partition``."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"{prefix}{i}.example"
        if partition_of(name, partitions) == partition:
            out.append(name)
        i += 1
    return out


def envs(hosts: list[str], per_host: int, tag: str = "") -> list[Envelope]:
    """``per_host`` requests of each of ``hosts`` (fingerprints: SHA-1 of host and path)."""
    return [
        Envelope(
            url=f"http://{h}/{tag}{i}",
            fingerprint=hashlib.sha1(f"{h}/{tag}{i}".encode()).digest(),
        )
        for h in hosts
        for i in range(per_host)
    ]


def site(host: str, n: int) -> list[Envelope]:
    """Pages ``/p0`` to ``/p{n-1}`` of ``host`` (Scrapy fingerprints)."""
    return [
        Envelope(url=f"http://{host}/p{i}", fingerprint=fingerprint(f"http://{host}/p{i}"))
        for i in range(n)
    ]


def open_partitioned(
    client: redis.Redis, partitions: int, crawl: str = "c", **settings: Any
) -> PartitionedFrontier:
    """Crawl ``crawl`` of ``partitions`` partitions (more than one)."""
    f = open_frontier(client, Settings(**{"partitions": partitions, **settings}), crawl)
    assert isinstance(f, PartitionedFrontier)
    return f


def polite_crawl(
    client: redis.Redis,
    clock: Clock,
    crawl: str,
    partitions: int,
    *,
    concurrency: int = 5,
    as_worker: bool = False,
    **settings: Any,
) -> FrontierCore:
    """Crawl ``crawl`` of ``partitions`` partitions with fleet-wide politeness on ``clock``:
    ``concurrency`` per site, no delay, jitter or retry backoff; ``as_worker``: its limits
    stored as a Scrapy worker stores them at open."""
    s = Settings(
        partitions=partitions,
        politeness_concurrency=concurrency,
        politeness_delay=0.0,
        politeness_randomize=False,
        retry_backoff=0.0,
        lease_ttl=60.0,
        **settings,
    )
    f = open_frontier(client, s, crawl, clock=clock)
    if as_worker:
        f.store_politeness(worker=True)
    return f


def lease_all(f: FrontierCore, worker: str = "w") -> list[Lease]:
    """Every request the crawl grants now (a lease call asks some of the partitions: one
    per 64 requests asked, then the others when those had nothing)."""
    out: list[Lease] = []
    while got := f.lease(worker, 100):
        out += got
    return out


def hosts(leases: list[Lease]) -> Counter[str]:
    """How many of ``leases`` each host has."""
    return Counter(lease.envelope.url.split("/")[2] for lease in leases)


def run_machine(name: str, client: redis.Redis, *, examples: int, steps: int, **attrs: Any) -> None:
    """tests/test_frontier_properties.py's state machine (conservation law, counters
    against a model, one owner per request, politeness caps) on ``client``, with ``attrs``
    (``backend``, ``ordering``, ``partitions``...): ``examples`` runs of ``steps`` steps."""
    cls: type[FrontierMachine] = type(name, (FrontierMachine,), {"client": client, **attrs})
    cls.TestCase.settings = hsettings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    cls.TestCase().runTest()
