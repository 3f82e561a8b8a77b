"""The streams backend under SIGKILL, fed through the HTTP API: a `redcrawl serve` process
(REDCRAWL_BACKEND=streams) takes 20,000 requests in batches from a producer while 4
consumer processes lease and ack them; two consumers are SIGKILLed at random moments while
they hold leases. At the end every request was acked exactly once, or re-delivered after a
kill and then acked; the counts are conserved; nothing is lost."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
import redis

from redcrawl.frontier import StreamsFrontier, open_frontier
from redcrawl.settings import Settings

from .conftest import RedisServer
from .killkit import kill_while_holding, parse_log, start_workers

N = 20_000
BATCH = 1000
ROOT = Path(__file__).resolve().parent.parent
CRAWL = "httpkill"
PRODUCED = "test:httpkill:produced"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "REDCRAWL_REDIS_URL": url,
        "REDCRAWL_API_PORT": str(port),
        "REDCRAWL_BACKEND": "streams",
    }
    env.pop("REDCRAWL_API_TOKENS", None)
    env.pop("REDCRAWL_API_ADMIN_TOKENS", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "redcrawl", "serve"],
            cwd=log.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{base}/v1/ready", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


@pytest.mark.slow
def test_http_producer_four_consumers_two_sigkilled(  # noqa: C901 (a scenario: producer, consumers, kills)
    redis7: RedisServer, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    seed = os.environ.get("RC_KILL_SEED", str(time.time_ns()))
    print(f"kill moments: RC_KILL_SEED={seed}")  # shown if the test fails
    rng = random.Random(seed)
    server, base = _serve(redis7.url, tmp_path / "serve.log")
    frontier = open_frontier(client, Settings(backend="streams"), CRAWL)
    assert isinstance(frontier, StreamsFrontier)
    logs = [tmp_path / f"w{i}.log" for i in range(4)]
    procs = start_workers(redis7.url, CRAWL, logs, "streams", PRODUCED)
    submitted: list[str] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with httpx.Client(base_url=base, timeout=30) as api:
                for start in range(0, N, BATCH):
                    items = [
                        {"url": f"http://site{i % 50}.example/page/{i}"}
                        for i in range(start, start + BATCH)
                    ]
                    r = api.post(f"/v1/crawls/{CRAWL}/requests", json={"requests": items})
                    r.raise_for_status()
                    body = r.json()
                    assert body["accepted"] == BATCH, body
                    submitted.extend(item["id"] for item in body["items"])
                    time.sleep(rng.uniform(0, 0.05))
            client.set(PRODUCED, 1)
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    producer = threading.Thread(target=produce)
    try:
        producer.start()
        victims = rng.sample(range(4), 2)
        # the moments: after a random share of the work is done, while the victim holds
        # leases (the first one most likely while the producer is still submitting)
        moments = sorted(rng.sample(range(N // 10, N * 7 // 10, 100), 2))
        held: dict[str, set[str]] = {}
        deadline = time.monotonic() + 50
        for v, at in zip(victims, moments, strict=True):
            name = f"w{v}"
            while frontier.counts().done < at:
                assert time.monotonic() < deadline, "no progress"
                assert not errors, errors
                time.sleep(0.005)
            held[name] = {
                x.id for x in kill_while_holding(procs[v], name, frontier, deadline, logs[v])
            }
        producer.join(60)
        assert not producer.is_alive() and not errors, errors
        for i, p in enumerate(procs):
            if i not in victims:
                assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.terminate()
        server.wait(10)

    c = frontier.counts()
    assert (c.accepted, c.done, c.dead, c.pending) == (N, N, 0, 0), c
    assert c.conserved and c.reclaimed >= sum(len(h) for h in held.values())
    assert len(set(submitted)) == N
    assert client.hlen(frontier.keys.req) == 0
    assert sum(client.xlen(k) for k in frontier.stream_keys()) == 0  # all acked and deleted

    processed: dict[str, list[str]] = defaultdict(list)
    acked: dict[str, list[str]] = defaultdict(list)
    for i, log in enumerate(logs):
        worker = f"w{i}"
        batches, acks = parse_log(log)
        for n, batch in enumerate(batches):
            for rid, _token in batch:
                processed[rid].append(worker)
            if n < len(acks):
                if worker not in held:
                    assert acks[n] == len(batch), f"{worker} lost a lease while alive"
                if acks[n] == len(batch):
                    for rid, _ in batch:
                        acked[rid].append(worker)
            else:
                assert worker in held, f"{worker} stopped without acking a batch"
    assert set(processed) == set(submitted), "a request was never handed out"
    twice = {rid: ws for rid, ws in acked.items() if len(ws) > 1}
    assert not twice, f"acked twice: {list(twice.items())[:5]}"
    assert set(acked) | set().union(*held.values()) >= set(submitted)
    for name, ids in held.items():
        for rid in ids:
            again = [w for w in processed[rid] if w != name]
            assert again, f"{rid} held by the killed {name} was never re-delivered"
            assert rid in acked and name not in acked[rid]
    # every request ends acked: the killed workers' unacknowledged work was re-delivered
    assert set(acked) == set(submitted)
