"""A partition of a partitioned crawl that lost its state (its Redis master came back empty)
while the others kept theirs: the sums looked like a smaller crawl, "finished" once the
rest was done (trial 8: 402 of 804 accepted, `status` said finished). Every partition
holds the crawl's identity from creation on, so the loss is reported (status, the API, a
worker's counts) until ``accept-loss``. On one server (keys deleted: what an empty master
holds) and on the real cluster (a master flushed)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from redcrawl.codec import Envelope
from redcrawl.errors import CrawlVanished, PartitionsLost
from redcrawl.frontier import PartitionedFrontier
from redcrawl.frontier.durability import IDENTITY_FIELD
from redcrawl.frontier.partitioned import CLAIMED_FIELD, CREATED_FIELD
from redcrawl.redis_server import LocalCluster
from redcrawl.workers import worker_command

from .apikit import AUTH_READ, ApiServer, api_settings
from .conftest import RedisServer
from .partition_helpers import envs, hosts_in, open_partitioned
from .sitekit import SiteSpec, serving

ROOT = Path(__file__).resolve().parent.parent
SITEKIT = Path(__file__).with_name("sitekit.py")

P = 4


def fill(f: PartitionedFrontier, per: int = 3, tag: str = "") -> None:
    """``per`` new requests on one host of each partition."""
    hosts = [hosts_in(p, f.n, 1)[0] for p in range(f.n)]
    assert f.push(envs(hosts, per, tag)).accepted == per * f.n


def drain(f: PartitionedFrontier, worker: str = "w") -> int:
    done = 0
    for _ in range(200):
        got = f.lease(worker, 50)
        if not got and f.counts().pending == 0:
            return done
        done += f.ack(got)
    raise AssertionError("the crawl did not drain")


def lose(client: redis.Redis, f: PartitionedFrontier, p: int) -> None:
    """Partition ``p``'s state is gone, as on a master that came back empty."""
    keys = list(client.scan_iter(match=f"rc:{{{f.crawl}/{p}}}:*"))
    assert keys
    client.delete(*keys)


def test_a_new_crawl_gives_every_partition_its_identity(redis7_client: redis.Redis) -> None:
    f = open_partitioned(redis7_client, P)
    fill(f)
    anchor = redis7_client.hgetall(f.keys.control)
    assert anchor[CLAIMED_FIELD.encode()] == b"1"
    held = [redis7_client.hget(sub.keys.control, CREATED_FIELD) for sub in f.parts]
    assert held == [anchor[CREATED_FIELD.encode()]] * P
    assert f.lost_partitions() == []
    # a second process opening it claims nothing new
    g = open_partitioned(redis7_client, P)
    fill(g, 1, "again")
    again = redis7_client.hgetall(g.keys.control)
    assert [again[k.encode()] for k in (CREATED_FIELD, CLAIMED_FIELD)] == [
        anchor[k.encode()] for k in (CREATED_FIELD, CLAIMED_FIELD)
    ]
    assert g.lost_partitions() == []


def test_a_lost_partition_is_reported_until_accepted(redis7_client: redis.Redis) -> None:
    """The bug: the other partitions' counts summed to a finished crawl. Now the loss is
    reported, also after a worker's call stored the partition's layout again (and a new
    identity), and a worker's "finished" raises PartitionsLost; ``accept_loss`` ends it."""
    f = open_partitioned(redis7_client, P)
    fill(f)
    lose(redis7_client, f, 2)
    assert f.lost_partitions() == [2]
    worker = open_partitioned(redis7_client, P)  # a worker started after the loss
    worker.check_vanished = True
    assert worker.push(envs(hosts_in(2, P, 1), 1, "after")).accepted == 1
    with pytest.raises(PartitionsLost, match=r"partition 2 of 0\.\.3 lost its state") as e:
        drain(worker)  # its calls store partition 2's layout again; then "finished"
    assert f.counts().done == 3 * (P - 1) + 1
    control = redis7_client.hgetall(f.parts[2].keys.control)  # stored again, a worker's
    assert IDENTITY_FIELD.encode() in control and CREATED_FIELD.encode() not in control
    assert f.lost_partitions() == [2]
    assert isinstance(e.value, CrawlVanished) and e.value.lost == [2]
    assert f.counts().finished  # a reader's counts are the sums, as before
    assert f.accept_loss() == [2]
    assert f.lost_partitions() == [] and f.accept_loss() == []
    fresh = open_partitioned(redis7_client, P)
    fresh.check_vanished = True
    fill(fresh, 1, "again")  # new requests after the loss: crawled as usual
    assert drain(fresh) == P
    assert fresh.counts().finished


def test_a_lost_anchor_takes_the_partitions_identity(
    redis7_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The anchor's master came back empty: the next process stores the anchor again with
    the identity its partitions hold (no partition reported lost); a partition lost with
    it is reported."""
    f = open_partitioned(redis7_client, P)
    fill(f)
    crawl_id = redis7_client.hget(f.keys.control, CREATED_FIELD)
    redis7_client.delete(*f.keys.all_keys())
    lose(redis7_client, f, 1)
    with caplog.at_level(logging.WARNING):
        g = open_partitioned(redis7_client, P)
        fill(g, 1, "again")
    assert "its anchor" in caplog.text and "lost its state" in caplog.text
    assert redis7_client.hget(g.keys.control, CREATED_FIELD) == crawl_id
    assert g.lost_partitions() == [1]


def test_a_claim_cut_short_is_completed_not_reported(redis7_client: redis.Redis) -> None:
    """A process died after storing the anchor and before every partition had the crawl's
    identity: the next one completes the claim (no partition reported lost)."""
    f = open_partitioned(redis7_client, P)
    fill(f)
    redis7_client.hdel(f.keys.control, CLAIMED_FIELD)
    redis7_client.hdel(f.parts[3].keys.control, CREATED_FIELD)
    assert f.lost_partitions() == []  # (not claimed: nothing compared)
    g = open_partitioned(redis7_client, P)
    fill(g, 1, "again")
    assert g.lost_partitions() == []
    assert redis7_client.hget(g.keys.control, CLAIMED_FIELD) == b"1"


def test_a_crawl_created_before_the_identities_is_checked_from_then_on(
    redis7_client: redis.Redis,
) -> None:
    """A crawl of an older redcrawl (no creation identity anywhere; older workers' own
    identities in the partitions they leased from): the first process of this one to
    write to it gives every partition the crawl's, so no partition is reported lost, and
    a loss after that is."""
    f = open_partitioned(redis7_client, P)
    fill(f)
    redis7_client.hdel(f.keys.control, CREATED_FIELD, CLAIMED_FIELD)
    for p, sub in enumerate(f.parts):
        redis7_client.hdel(sub.keys.control, CREATED_FIELD)
        redis7_client.hset(sub.keys.control, IDENTITY_FIELD, f"own{p}")
    assert f.lost_partitions() == []
    g = open_partitioned(redis7_client, P)
    fill(g, 1, "again")
    assert g.lost_partitions() == []
    lose(redis7_client, g, 0)
    assert g.lost_partitions() == [0]


def test_a_purged_crawl_starts_afresh(redis7_client: redis.Redis) -> None:
    f = open_partitioned(redis7_client, P)
    fill(f)
    lose(redis7_client, f, 0)
    f.purge()
    fill(f)
    assert f.lost_partitions() == []


def test_status_and_accept_loss_commands(
    redis7: RedisServer, redis7_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a user sees: ``status`` says damaged (and the JSON lists the partitions),
    ``crawls`` too; ``accept-loss -y`` ends it; asked again: nothing to accept."""
    from redcrawl.cli import app

    f = open_partitioned(redis7_client, P)
    fill(f)
    drain(f)
    lose(redis7_client, f, 2)
    monkeypatch.setenv("REDCRAWL_REDIS_URL", redis7.url)
    run = CliRunner().invoke
    out = run(app, ["status", "--crawl", "c"])
    assert out.exit_code == 0, out.output
    assert "damaged: partition 2 lost" in out.output
    assert "error: crawl 'c': partition 2 of 0..3 lost its state" in out.output
    assert "redcrawl accept-loss" in out.output
    got = json.loads(run(app, ["status", "--crawl", "c", "--json"]).output)
    assert got["lost_partitions"] == [2] and got["state"].startswith("damaged")
    assert "damaged: partition 2 lost" in run(app, ["crawls"]).output
    no = run(app, ["accept-loss", "--crawl", "c"], input="n\n")
    assert no.exit_code == 1 and "not accepted" in no.output
    assert f.lost_partitions() == [2]
    yes = run(app, ["accept-loss", "--crawl", "c", "-y"])
    assert yes.exit_code == 0 and "without what partition(s) 2 held" in yes.output
    got = json.loads(run(app, ["status", "--crawl", "c", "--json"]).output)
    assert got["lost_partitions"] == [] and got["state"] == "finished"
    again = run(app, ["accept-loss", "--crawl", "c", "-y"])
    assert again.exit_code == 0 and "lost no partition" in again.output


@pytest.mark.cluster
def test_a_master_that_came_back_empty_on_the_cluster(
    redis_cluster: LocalCluster, cluster_client: redis.Redis
) -> None:
    """On the real cluster: the master of one partition is flushed (what a restart
    without persistence leaves): every partition on it is reported lost, and only those."""
    cluster: Any = cluster_client  # (a ClusterClient)
    f = open_partitioned(cluster_client, 16)
    fill(f)
    drain(f)
    anchor_node = cluster.get_node_from_key(f.keys.control)
    victim = next(node for node in cluster.get_primaries() if node.name != anchor_node.name)
    on_victim = [
        p
        for p, sub in enumerate(f.parts)
        if cluster.get_node_from_key(sub.keys.control).name == victim.name
    ]
    assert 0 < len(on_victim) < 16
    cluster.flushall(target_nodes=victim)
    assert f.lost_partitions() == on_victim
    assert f.counts().finished  # the bug: what was left looked like the whole crawl
    worker = open_partitioned(cluster_client, 16)
    worker.check_vanished = True
    with pytest.raises(PartitionsLost):
        drain(worker)
        worker.counts()
    assert f.accept_loss() == on_victim
    assert f.lost_partitions() == []


def test_the_api_lists_the_lost_partitions(redis7: RedisServer, redis7_client: redis.Redis) -> None:
    """``GET /v1/crawls/{crawl}``: ``lost_partitions``, [] once accepted."""
    f = open_partitioned(redis7_client, P)
    fill(f)
    api = ApiServer(api_settings(redis7.url), redis7_client)
    try:
        get = lambda: httpx.get(f"{api.url}/v1/crawls/c", headers=AUTH_READ, timeout=10)  # noqa: E731
        assert get().json()["lost_partitions"] == []
        lose(redis7_client, f, 3)
        assert get().json()["lost_partitions"] == [3]
        f.accept_loss()
        assert get().json()["lost_partitions"] == []
    finally:
        api.stop()


@pytest.mark.slow
def test_a_scrapy_worker_on_a_damaged_crawl(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    """What a Scrapy user sees: a finished partitioned crawl lost a partition; a worker run
    on it again does not say "finished" (exit 1, reason crawl_vanished, what to do); after
    ``redcrawl accept-loss`` it does (exit 0)."""
    from redcrawl.cli import app

    env = {
        **os.environ,
        "REDCRAWL_REDIS_URL": redis7.url,
        "REDCRAWL_CRAWL": "damaged",
        "REDCRAWL_PARTITIONS": str(P),
        "PYTHONPATH": str(ROOT / "src"),
    }
    with serving([SiteSpec(pages=6, links=2) for _ in range(3)]) as kit:
        cmd = worker_command(
            SITEKIT,
            settings=["ROBOTSTXT_OBEY=False", "TELNETCONSOLE_ENABLED=False", "LOG_LEVEL=INFO"],
            spider_args={"urls": ",".join(kit.roots)},
        )

        def run(name: str) -> tuple[int, str]:
            log = tmp_path / f"{name}.log"
            with log.open("wb") as out:
                rc = subprocess.run(
                    cmd, env=env, stdout=subprocess.DEVNULL, stderr=out, timeout=120
                ).returncode
            return rc, log.read_text()

        rc, text = run("first")
        assert rc == 0, text[-3000:]
        f = open_partitioned(redis7_client, P, "damaged")
        c = f.counts()
        assert c.finished and c.done >= 18, c
        lose(redis7_client, f, f.partition(Envelope(url=kit.roots[0])))
        rc, text = run("again")
        assert rc == 1, text[-3000:]
        assert "reason 'crawl_vanished'" in text, text[-3000:]
        assert "lost its state" in text and "redcrawl accept-loss" in text
        assert "crawl 'damaged' is finished" not in text
        got = CliRunner().invoke(app, ["accept-loss", "-y"], env=env)
        assert got.exit_code == 0, got.output
        rc, text = run("accepted")
        assert rc == 0, text[-3000:]
        assert "crawl 'damaged' is finished" in text
