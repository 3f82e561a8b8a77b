#!/usr/bin/env python
"""Benchmark a partitioned crawl (``REDCRAWL_PARTITIONS=16``) on Redis Clusters of 1, 2 and
3 masters, in one run.

Usage::

    python bench/bench_cluster.py [--n 20000] [--hosts 400] [--clients 3] [--partitions 16]
                                  [--masters 1,2,3] [--json PATH]

For each cluster size a fresh cluster of that many masters (no replicas) is built on
loopback (``redis-server --cluster-enabled yes``, slots split evenly with ``CLUSTER
ADDSLOTSRANGE`` and joined with ``CLUSTER MEET``: ``redis-cli --cluster create`` wants 3
masters at least), then ``--clients`` processes, through ``redis+cluster://``:

* **push**: each pushes its share of ``--n`` requests (``--hosts`` sites, a fingerprint
  each) in batches of ``--batch`` (100; ``FrontierCore.push``: dedupe and enqueue);
* **lease+ack**: each leases 50 at a time and acks the previous batch in the same settle
  (``settle(ack=..., lease=...)``, what a worker does), until the crawl is finished.

A reference row comes first: one master, one partition (``REDCRAWL_PARTITIONS=1``).
Printed per size: throughput of each phase (requests/s, wall clock), Redis CPU per
request (``INFO cpu`` user+sys delta of every master over the phase, divided by ``--n``)
summed and **per master**, the partitions each master holds, and the ceiling the busiest
master's CPU per request predicts (1 / its CPU per request: what one core per master
would allow). On a machine with few cores the raw throughput does not scale with the
masters: every master, every client process and the client's own Python share the same
cores, so the clients' CPU (which grows with P: one script call per partition touched)
is what limits; the per-master CPU per request is the figure that predicts scaling on
machines with a core per master.

A benchmark, not a test: nothing here fails on a number.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from redcrawl.codec import Envelope  # noqa: E402
from redcrawl.connection import connect  # noqa: E402
from redcrawl.frontier import open_frontier  # noqa: E402
from redcrawl.redis_server import RedisServer, find_binary, free_port  # noqa: E402
from redcrawl.settings import Settings  # noqa: E402

CRAWL = "bench"
SLOTS = 16384


class Cluster:
    """``masters`` cluster-enabled redis-servers sharing the 16384 slots evenly."""

    def __init__(self, masters: int, directory: Path) -> None:
        binary = find_binary("7") or find_binary()
        if binary is None:
            raise SystemExit("no redis-server found: install Debian's redis-server")
        self.nodes: list[RedisServer] = []
        buses: list[int] = []
        try:
            for i in range(masters):
                bus = free_port()
                buses.append(bus)
                extra = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
                extra += ["--cluster-port", str(bus), "--save", "", "--appendonly", "no"]
                self.nodes.append(RedisServer(binary, directory / f"n{i}", extra=extra))
            clients: list[Any] = [redis.Redis(port=n.port) for n in self.nodes]
            for i, c in enumerate(clients):
                lo, hi = SLOTS * i // masters, SLOTS * (i + 1) // masters - 1
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            for n, bus in zip(self.nodes[1:], buses[1:], strict=True):
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", n.port, bus)
            deadline = time.monotonic() + 30
            while not all(_ready(c, masters) for c in clients):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not come up")
                time.sleep(0.05)
            for c in clients:
                c.close()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def cpu(self) -> list[float]:
        """Seconds of CPU (user + sys) each master has used."""
        out = []
        for n in self.nodes:
            with redis.Redis(port=n.port) as c:
                info: Any = c.info("cpu")
            out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
        return out

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def _ready(client: Any, masters: int) -> bool:
    """The node sees the cluster ok, with every master."""
    raw = client.execute_command("CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    info = dict(line.split(":", 1) for line in text.split() if ":" in line)
    return info.get("cluster_state") == "ok" and info.get("cluster_known_nodes") == str(masters)


def settings(url: str, partitions: int, batch: int = 100) -> Settings:
    return Settings(redis_url=url, partitions=partitions, batch_size=batch, lease_ttl=60)


def push_part(url: str, partitions: int, hosts: int, lo: int, hi: int, batch: int) -> None:
    s = settings(url, partitions, batch)
    f = open_frontier(connect(s), s, CRAWL)
    for start in range(lo, hi, batch):
        f.push(
            [
                Envelope(
                    url=f"http://site{i % hosts}.example/{i}",
                    fingerprint=hashlib.sha1(b"%d" % i).digest(),
                )
                for i in range(start, min(start + batch, hi))
            ]
        )


def lease_ack(url: str, partitions: int, worker: str) -> None:
    s = settings(url, partitions)
    f = open_frontier(connect(s), s, CRAWL)
    held: list[Any] = []
    idle = 0
    while True:
        out = f.settle(ack=held, lease=(worker, 50))
        held = out.leases
        if held:
            idle = 0
            continue
        idle += 1
        if idle > 3 and f.counts().finished:
            return
        time.sleep(0.01)


def phase(cluster: Cluster, target: Any, jobs: list[tuple[Any, ...]]) -> tuple[float, list[float]]:
    """Run ``target`` once per job in its own process; (wall seconds, CPU per master)."""
    before = cluster.cpu()
    t0 = time.perf_counter()
    procs = [multiprocessing.Process(target=target, args=job) for job in jobs]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a client process failed ({p.exitcode})")
    wall = time.perf_counter() - t0
    return wall, [b - a for a, b in zip(before, cluster.cpu(), strict=True)]


def run_size(
    masters: int, partitions: int, args: argparse.Namespace, directory: Path
) -> dict[str, Any]:
    cluster = Cluster(masters, directory / f"m{masters}p{partitions}")
    try:
        url, n, k = cluster.url, args.n, args.clients
        shares = [
            (url, partitions, args.hosts, n * i // k, n * (i + 1) // k, args.batch)
            for i in range(k)
        ]
        push_wall, push_cpu = phase(cluster, push_part, shares)
        s = settings(url, partitions)
        client: Any = connect(s)
        f = open_frontier(client, s, CRAWL)
        assert f.counts().accepted == n, f.counts()
        per_master = [0] * masters
        ports = [nd.port for nd in cluster.nodes]
        for sub in getattr(f, "parts", [f]):
            node = client.get_node_from_key(sub.keys.req)
            per_master[ports.index(int(node.port))] += 1
        lease_wall, lease_cpu = phase(
            cluster, lease_ack, [(url, partitions, f"w{i}") for i in range(k)]
        )
        c = f.counts()
        assert c.done == n and c.finished, c
        client.close()
    finally:
        cluster.stop()
    return {
        "masters": masters,
        "partitions": partitions,
        "partitions_per_master": per_master,
        "push_per_s": n / push_wall,
        "push_cpu_us_per_req": [1e6 * x / n for x in push_cpu],
        "lease_ack_per_s": n / lease_wall,
        "lease_ack_cpu_us_per_req": [1e6 * x / n for x in lease_cpu],
    }


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"bench_cluster: {args.n} requests over {args.hosts} sites, P={args.partitions}, "
        f"pushes of {args.batch}, "
        f"{args.clients} client processes, {os.cpu_count()} cores on this machine",
        "",
        f"{'masters':>7}  {'P':>3}  {'tags/master':<12} {'phase':<9} {'req/s':>8}"
        f"  {'Redis CPU us/req':>16}  {'per master us/req':<24} {'ceiling req/s':>13}",
    ]
    for r in rows:
        for name, rate, cpu in (
            ("push", r["push_per_s"], r["push_cpu_us_per_req"]),
            ("lease+ack", r["lease_ack_per_s"], r["lease_ack_cpu_us_per_req"]),
        ):
            per = " ".join(f"{x:.1f}" for x in cpu)
            ceiling = 1e6 / max(cpu) if max(cpu) > 0 else float("inf")
            tags = "/".join(map(str, r["partitions_per_master"]))
            lines.append(
                f"{r['masters']:>7}  {r['partitions']:>3}  {tags:<12} {name:<9} {rate:>8.0f}"
                f"  {sum(cpu):>16.1f}  {per:<24} {ceiling:>13.0f}"
            )
    lines += [
        "",
        "ceiling: 1 / the busiest master's CPU per request, what one core per master would",
        "allow. Raw req/s is bounded here by the clients' own CPU (Python, one script call",
        "per partition touched) and by every process sharing this machine's cores.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--hosts", type=int, default=400)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--masters", default="1,2,3")
    parser.add_argument("--batch", type=int, default=100, help="requests per push call")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="skip the reference row (one master, one partition)",
    )
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="redcrawl-bench-cluster-") as tmp:
        if args.reference:  # a crawl of one partition on one master: today's layout
            rows.append(run_size(1, 1, args, Path(tmp)))
        for masters in (int(m) for m in args.masters.split(",")):
            rows.append(run_size(masters, args.partitions, args, Path(tmp)))
            print(f"... {masters} master(s) done", file=sys.stderr)
    print(report(rows, args))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
