"""Start-time checks of the Redis server (eviction policy, memory, dedupe encoding) and
importing a scrapy-redis dupefilter, on a real Redis."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
import redis
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.errors import ConfigError
from redcrawl.frontier import ListsFrontier
from redcrawl.guard import MemoryWatch, check_server
from redcrawl.settings import Settings

from .conftest import RedisServer

runner = CliRunner()


@pytest.fixture
def memory_config(redis7_client: redis.Redis) -> Iterator[redis.Redis]:
    """The test may change maxmemory and its policy; they are restored after."""
    before = redis7_client.config_get("maxmemory*")
    yield redis7_client
    for name in ("maxmemory", "maxmemory-policy"):
        redis7_client.config_set(name, before[name])


def frontier(client: redis.Redis, **settings: object) -> ListsFrontier:
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


def test_cli_crawl_refuses_an_evicting_server(memory_config: redis.Redis,
                                              redis7: RedisServer) -> None:
    memory_config.config_set("maxmemory", 2**30)
    memory_config.config_set("maxmemory-policy", "allkeys-lru")
    from redcrawl.demo.run import SPIDER  # a spider that exists (checked first)

    result = runner.invoke(app, ["crawl", str(SPIDER), "--redis-url", redis7.url,
                                 "--crawl", "g", "--no-progress"])
    assert result.exit_code == 2, result.output
    assert "maxmemory-policy is allkeys-lru" in " ".join(result.output.split())


def test_import_dupefilter_from_scrapy_redis_set(redis7_client: redis.Redis,
                                                 redis7: RedisServer) -> None:
    hexes = [hashlib.sha1(b"%d" % i).hexdigest() for i in range(25_000)]
    redis7_client.sadd("spider:dupefilter", *hexes, "not-a-fingerprint")
    f = frontier(redis7_client)
    f.done.add([bytes.fromhex(hexes[0])])               # one already known
    args = ["import-dupefilter", "spider:dupefilter", "--redis-url", redis7.url,
            "--crawl", "g", "--batch", "1000"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "25,001 fingerprints" in result.output and "24,999 added" in result.output
    assert "1 already there" in result.output and "1 invalid" in result.output
    assert f.done.contains([bytes.fromhex(h) for h in hexes]) == [True] * len(hexes)
    assert redis7_client.scard("spider:dupefilter") == 25_001  # the source is untouched
    assert "0 added" in runner.invoke(app, args).output      # running again is harmless
    missing = runner.invoke(app, [*args[:1], "nope:dupefilter", *args[2:]])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_serve_refuses_an_evicting_server(memory_config: redis.Redis,
                                          redis7: RedisServer) -> None:
    from redcrawl.api import serve

    memory_config.config_set("maxmemory", 2**30)
    memory_config.config_set("maxmemory-policy", "allkeys-random")
    with pytest.raises(ConfigError, match="allkeys-random"):
        serve(Settings(redis_url=redis7.url, api_port=1))  # refused before binding
