#!/usr/bin/env python
"""Benchmark submitting requests through the HTTP API (``redcrawl serve``).

Usage::

    python bench/bench_api.py [--n 5000] [--batches 1,500] [--rounds 3]
                              [--backends lists,streams] [--frontier-n 20000]

A fresh ``redis-server`` (as in ``bench_frontier.py``) is started on a free loopback
port, and ``redcrawl serve`` (uvicorn, one process, no tokens, loopback) in a subprocess
against it, once per frontier backend (``REDCRAWL_BACKEND``: the API creates its crawls
with it). One httpx client with keep-alive then submits N distinct requests per batch
size, one ``POST /v1/crawls/{crawl}/requests`` per batch, sequentially, into a new crawl
each time. Reported per backend and batch size (median over rounds): requests/s, calls/s
and the median call latency; and, as the floor of the HTTP stack (client, uvicorn,
FastAPI, no Redis), the calls/s of ``GET /v1/health``. Then, in the same run,
``bench_streams.py`` measures the backends themselves (push and lease+ack, streams vs
lists). Everything runs on one machine, so the client, the API process and Redis share
its cores.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from bench_frontier import RedisServer, _on_signal, markdown_table, server_binary

from redcrawl.redis_server import free_port as _free_port

ROOT = Path(__file__).resolve().parent.parent


class ApiProcess:
    """``python -m redcrawl serve`` on a free loopback port, stopped by :meth:`stop`."""

    def __init__(self, redis_url: str, max_batch: int, backend: str = "lists") -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "REDCRAWL_REDIS_URL": redis_url,
            "REDCRAWL_BACKEND": backend,
            "REDCRAWL_API_PORT": str(self.port),
            "REDCRAWL_API_MAX_BATCH": str(max_batch),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
            ),
        }
        for name in ("REDCRAWL_API_TOKENS", "REDCRAWL_API_ADMIN_TOKENS", "REDCRAWL_API_HOST"):
            env.pop(name, None)
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "redcrawl", "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/v1/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redcrawl serve did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run(client: httpx.Client, crawl: str, n: int, batch: int) -> tuple[float, float]:
    """Submit n distinct requests in batches; (seconds, median call latency in ms)."""
    bodies = [
        {
            "requests": [
                {"url": f"https://example.com/{crawl}/item/{i}?page={i % 50}"}
                for i in range(start, min(start + batch, n))
            ]
        }
        for start in range(0, n, batch)
    ]
    latencies = []
    t0 = time.perf_counter()
    for body in bodies:
        t = time.perf_counter()
        r = client.post(f"/v1/crawls/{crawl}/requests", json=body)
        latencies.append(time.perf_counter() - t)
        if r.status_code != 200 or r.json()["accepted"] != len(body["requests"]):
            raise RuntimeError(f"submit failed: {r.status_code} {r.text[:300]}")
    return time.perf_counter() - t0, 1000 * statistics.median(latencies)


def floor(client: httpx.Client, calls: int) -> float:
    """Calls/s of GET /v1/health: the HTTP stack's own cost, without Redis."""
    t0 = time.perf_counter()
    for _ in range(calls):
        client.get("/v1/health").raise_for_status()
    return calls / (time.perf_counter() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--n", type=int, default=5000, help="requests per batch size and round")
    p.add_argument("--batches", default="1,500", help="comma-separated batch sizes")
    p.add_argument("--rounds", type=int, default=3, help="rounds; the median is reported")
    p.add_argument(
        "--backends",
        default="lists,streams",
        help="comma-separated frontier backends the API creates crawls with",
    )
    p.add_argument(
        "--frontier-n",
        type=int,
        default=20000,
        help="then bench_streams.py with this N (streams vs lists lease+ack in "
        "the same run); 0 skips it",
    )
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.n < 1 or args.rounds < 1 or min(batches) < 1 or not backends:
        p.error("--n, --rounds and batch sizes must be positive, and give a backend")
    signal.signal(signal.SIGTERM, _on_signal)

    redis_server = RedisServer(server_binary())
    results: dict[tuple[str, int], list[tuple[float, float]]] = {
        (be, b): [] for be in backends for b in batches
    }
    floors: list[float] = []
    try:
        for be in backends:
            api = ApiProcess(redis_server.url, max(batches), be)
            try:
                with httpx.Client(base_url=api.url, timeout=60) as client:
                    run(client, f"warmup-{be}", 200, 50)
                    for r in range(args.rounds):
                        for b in batches:
                            results[be, b].append(run(client, f"{be}-b{b}-r{r}", args.n, b))
                        floors.append(floor(client, 1000))
            finally:
                api.stop()
    finally:
        redis_server.stop()

    rows = [["backend", "batch size", "requests/s", "calls/s", "median call (ms)"]]
    for be in backends:
        for b in batches:
            secs = statistics.median(s for s, _ in results[be, b])
            lat = statistics.median(ms for _, ms in results[be, b])
            calls = -(-args.n // b)
            rows.append([be, str(b), f"{args.n / secs:,.0f}", f"{calls / secs:,.0f}", f"{lat:.2f}"])
    rows.append(["(GET /v1/health)", "-", "-", f"{statistics.median(floors):,.0f}", "-"])
    print(
        f"redcrawl API submit throughput: {args.n} distinct requests per batch size, "
        f"median of {args.rounds} rounds, one uvicorn process, {os.cpu_count()} cores\n"
    )
    print(markdown_table(rows), flush=True)
    if args.frontier_n > 0:
        import bench_streams

        print("\nThe backends themselves (bench_streams.py, same run):\n", flush=True)
        return bench_streams.main(["--n", str(args.frontier_n), "--rounds", str(args.rounds)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
