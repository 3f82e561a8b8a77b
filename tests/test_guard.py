"""Start-time checks of the Redis server (eviction policy, memory, dedupe encoding) and
importing a scrapy-redis dupefilter, on a real Redis."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.exceptions
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.codec import Envelope
from redcrawl.connection import connect
from redcrawl.errors import ConfigError
from redcrawl.frontier import FrontierCore, ListsFrontier, open_frontier
from redcrawl.guard import MemoryWatch, check_memory_policy, check_server
from redcrawl.settings import Settings
from redcrawl.workers import worker_command

from .conftest import RedisServer, _free_port

ROOT = Path(__file__).resolve().parent.parent

runner = CliRunner()


@pytest.fixture
def memory_config(redis7_client: redis.Redis) -> Iterator[redis.Redis]:
    """The test may change maxmemory and its policy; they are restored after."""
    before = redis7_client.config_get("maxmemory*")
    yield redis7_client
    for name in ("maxmemory", "maxmemory-policy"):
        value = before[name]
        assert value is not None
        redis7_client.config_set(name, value)


def frontier(client: redis.Redis, **settings: object) -> FrontierCore:
    return ListsFrontier(client, Settings(**settings), "g")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_allkeys_eviction_is_refused(memory_config: redis.Redis, policy: str) -> None:
    memory_config.config_set("maxmemory", 2**30)
    memory_config.config_set("maxmemory-policy", policy)
    with pytest.raises(ConfigError, match=f"maxmemory-policy is {policy}.*noeviction"):
        check_server(frontier(memory_config))
    warnings = check_server(frontier(memory_config, allow_eviction=True))
    assert any("running anyway" in w for w in warnings)


def test_volatile_eviction_refused_only_with_expiring_fingerprints(
    memory_config: redis.Redis,
) -> None:
    memory_config.config_set("maxmemory", 2**30)
    memory_config.config_set("maxmemory-policy", "volatile-lru")
    assert check_server(frontier(memory_config)) == []
    with pytest.raises(ConfigError, match="REDCRAWL_RECRAWL_AFTER"):
        check_server(frontier(memory_config, recrawl_after=3600))


def test_policy_without_maxmemory_is_a_warning(memory_config: redis.Redis) -> None:
    memory_config.config_set("maxmemory", 0)
    memory_config.config_set("maxmemory-policy", "allkeys-lru")
    [warning] = check_server(frontier(memory_config))
    assert "once a maxmemory is set" in warning


def test_memory_threshold_warns(memory_config: redis.Redis) -> None:
    used = int(memory_config.info("memory")["used_memory"])
    memory_config.config_set("maxmemory", int(used / 0.95))  # ~95% used
    [warning] = check_server(frontier(memory_config, memory_warn_ratio=0.9))
    assert "of its maxmemory" in warning
    watch = MemoryWatch(memory_config, Settings(memory_warn_ratio=0.9), interval=3600)
    assert watch.check() is not None
    assert watch.check() is None  # at most once per interval
    memory_config.config_set("maxmemory", used * 4)
    assert check_server(frontier(memory_config, memory_warn_ratio=0.9)) == []


def test_cli_crawl_refuses_an_evicting_server(
    memory_config: redis.Redis, redis7: RedisServer
) -> None:
    memory_config.config_set("maxmemory", 2**30)
    memory_config.config_set("maxmemory-policy", "allkeys-lru")
    from redcrawl.demo.run import SPIDER  # a spider that exists (checked first)

    result = runner.invoke(
        app, ["crawl", str(SPIDER), "--redis-url", redis7.url, "--crawl", "g", "--no-progress"]
    )
    assert result.exit_code == 2, result.output
    assert "maxmemory-policy is allkeys-lru" in " ".join(result.output.split())


def test_import_dupefilter_from_scrapy_redis_set(
    redis7_client: redis.Redis, redis7: RedisServer
) -> None:
    hexes = [hashlib.sha1(b"%d" % i).hexdigest() for i in range(25_000)]
    redis7_client.sadd("spider:dupefilter", *hexes, "not-a-fingerprint")
    f = frontier(redis7_client)
    f.done.add([bytes.fromhex(hexes[0])])  # one already known
    args = [
        "import-dupefilter",
        "spider:dupefilter",
        "--redis-url",
        redis7.url,
        "--crawl",
        "g",
        "--batch",
        "1000",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "25,001 fingerprints" in result.output and "24,999 added" in result.output
    assert "1 already there" in result.output and "1 invalid" in result.output
    assert f.done.contains([bytes.fromhex(h) for h in hexes]) == [True] * len(hexes)
    assert redis7_client.scard("spider:dupefilter") == 25_001  # the source is untouched
    assert "0 added" in runner.invoke(app, args).output  # running again is harmless
    missing = runner.invoke(app, [*args[:1], "nope:dupefilter", *args[2:]])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_serve_refuses_an_evicting_server(memory_config: redis.Redis, redis7: RedisServer) -> None:
    from redcrawl.api import serve

    memory_config.config_set("maxmemory", 2**30)
    memory_config.config_set("maxmemory-policy", "allkeys-random")
    with pytest.raises(ConfigError, match="allkeys-random"):
        serve(Settings(redis_url=redis7.url, api_port=1))  # refused before binding


# --- least-privilege Redis: an ACL user limited to the crawl's keys (issue 11 item 7) -----


@pytest.fixture
def acl_url(redis7_client: redis.Redis, redis7: RedisServer) -> Iterator[str]:
    """A Redis 7 user that may touch only rc:* keys and no @dangerous command (INFO,
    CONFIG, ...), as a cautious operator gives a crawl."""
    user = f"rc-acl-{uuid.uuid4().hex[:8]}"
    redis7_client.execute_command(
        "ACL", "SETUSER", user, "on", ">pw", "~rc:*", "+@all", "-@dangerous"
    )
    try:
        yield redis7.url.replace("redis://", f"redis://{user}:pw@")
    finally:
        redis7_client.execute_command("ACL", "DELUSER", user)


def test_acl_user_really_lacks_info(acl_url: str) -> None:
    client = redis.Redis.from_url(acl_url)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.info("memory")
    client.close()


def test_start_checks_degrade_to_a_warning_without_info(acl_url: str) -> None:
    client = connect(Settings(redis_url=acl_url))
    try:
        f = open_frontier(client, Settings(redis_url=acl_url), "acl")
        warnings = check_server(f)  # no NoPermissionError
        [info] = [w for w in warnings if "INFO" in w]
        assert "eviction policy" in info and "memory" in info
        assert "not allowed" in info and "+info" in info  # what to do about it
        assert check_memory_policy(client, Settings()) == [info]
        watch = MemoryWatch(client, Settings(), interval=0)
        assert watch.check() is None  # said once at start; the watch gives up quietly
        assert watch.check() is None
    finally:
        client.close()


def test_frontier_works_for_an_acl_user(acl_url: str) -> None:
    settings = Settings(redis_url=acl_url, lease_ttl=5, politeness=False)  # one host, lease 10
    client = connect(settings)
    try:
        f = open_frontier(client, settings, "acl-ops")
        f.purge()
        envs = [
            Envelope(url=f"http://example.com/{i}", fingerprint=hashlib.sha1(b"%d" % i).digest())
            for i in range(10)
        ]
        assert f.push(envs).accepted == 10
        assert f.push(envs).accepted == 0  # deduplicated
        leased = f.lease("w", 10)
        assert len(leased) == 10
        f.ack(leased[:9])
        assert f.nack(leased[9], "boom", retry=False) == "dead"
        c = f.counts()
        assert c.conserved and c.done == 9 and c.dead == 1
        f.purge()
    finally:
        client.close()


def test_serve_starts_for_an_acl_user(acl_url: str, tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    env |= {"PYTHONPATH": str(ROOT / "src"), "REDCRAWL_REDIS_URL": acl_url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "redcrawl", "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60  # a hang guard, not a timing assert
        answer = None
        while answer is None and proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/crawls", timeout=5) as r:
                    answer = json.loads(r.read())
            except OSError:
                time.sleep(0.2)
        assert proc.poll() is None, "serve died at start"
        assert answer is not None and "crawls" in answer
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "NoPermissionError" not in err and "Traceback" not in err
    assert "INFO" in err and "not allowed" in err


@pytest.mark.slow
def test_whole_crawl_as_an_acl_user(
    acl_url: str, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    from redcrawl.demo.run import SPIDER, demo_worker_settings
    from redcrawl.demo.site import ShopSite, SiteConfig

    crawl = f"acl-crawl-{uuid.uuid4().hex[:6]}"
    items_db = tmp_path / "items.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    env |= {"PYTHONPATH": str(ROOT / "src"), "REDCRAWL_REDIS_URL": acl_url, "REDCRAWL_CRAWL": crawl}
    with ShopSite(SiteConfig(products=60, per_page=20, categories=3)) as site:
        cmd = worker_command(
            SPIDER,
            settings=[
                "LOG_LEVEL=INFO",
                *demo_worker_settings(items_db),
                "REDCRAWL_IDLE_BEFORE_CLOSE=0",
            ],
            spider_args={"url": site.url},
        )
        result = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        pages = len(site.canonical_pages())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NoPermissionError" not in result.stderr
    assert "INFO is not allowed" in result.stderr  # the warning, once
    c = open_frontier(redis7_client, Settings(), crawl).counts()
    assert c.finished and c.conserved and c.done >= pages, c
