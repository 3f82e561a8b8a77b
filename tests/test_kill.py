"""Multi-process test: 4 worker processes lease and ack 20,000 requests from one frontier
(each backend); one is SIGKILLed midway. Afterwards every request is DONE exactly once,
and whatever the killed worker held was handed out again after its leases expired."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path

import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.frontier import open_frontier
from redcrawl.settings import Settings

from .conftest import RedisServer
from .killkit import kill_one_midway, parse_log

N = 20_000


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lists", "streams"])
def test_sigkill_one_of_four_workers_loses_nothing(
    redis7: RedisServer, tmp_path: Path, backend: str
) -> None:
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    crawl = "kill"
    frontier = open_frontier(client, Settings(backend=backend), crawl)  # type: ignore[arg-type]
    envs = [
        Envelope(url=f"http://site/{i}", fingerprint=hashlib.sha1(b"%d" % i).digest())
        for i in range(N)
    ]
    assert frontier.push(envs).accepted == N

    logs = [tmp_path / f"w{i}.log" for i in range(4)]
    held_at_kill = kill_one_midway(redis7.url, crawl, logs, backend, frontier, N)

    c = frontier.counts()
    assert (c.accepted, c.done, c.dead, c.pending) == (N, N, 0, 0), c
    assert c.conserved
    assert client.hlen(frontier.keys.req) == 0
    assert frontier.done.contains([e.fingerprint for e in envs if e.fingerprint]) == [True] * N

    processed: dict[str, list[tuple[str, str]]] = defaultdict(list)
    acked_ids: dict[str, list[str]] = defaultdict(list)
    unacked_victim: set[str] = set()
    for i, log in enumerate(logs):
        batches, acked = parse_log(log)
        worker = f"w{i}"
        for n, batch in enumerate(batches):
            for rid, token in batch:
                processed[rid].append((worker, token))
            if n < len(acked):
                # survivors never lose a lease: every batch they ack is fully theirs
                if worker != "w1":
                    assert acked[n] == len(batch)
                if acked[n] == len(batch):
                    for rid, _ in batch:
                        acked_ids[rid].append(worker)
            else:
                assert worker == "w1", f"{worker} stopped without acking a batch"
                unacked_victim |= {rid for rid, _ in batch}

    assert len(processed) == N  # every request was processed by someone
    twice = {rid: ws for rid, ws in acked_ids.items() if len(ws) > 1}
    assert not twice, f"acked by two workers: {list(twice.items())[:5]}"
    victim_held = {x.id for x in held_at_kill if x.worker == "w1"}
    assert victim_held, "the kill came when the victim held nothing; the test proved little"
    for rid in victim_held:
        again = [(w, t) for w, t in processed[rid] if w != "w1"]
        assert again, f"{rid} held by the killed worker was never handed out again"
        assert rid in acked_ids
    # Ids without an acked batch were the victim's last, unacknowledged work: re-leased.
    for rid in set(processed) - set(acked_ids):
        pytest.fail(f"{rid} was processed but never acknowledged by anyone")
    assert unacked_victim <= victim_held | set(acked_ids)
