"""Fleet-wide politeness where operators look: ``redcrawl status`` (human and ``--json``)
shows a crawl's politeness counters (deferrals by reason, keys blocked now, politeness
wait), and a ``scrapy crawl`` worker says at start which limits the fleet enforces (the
same words ``redcrawl crawl`` prints: :func:`redcrawl.politeness.describe.fleet_limits`).
Real Redis; real Scrapy workers against the loopback sites of tests/sitekit.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import redis
from typer.testing import CliRunner

from redcrawl.cli import app
from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.politeness.describe import fleet_limits
from redcrawl.settings import Settings
from redcrawl.workers import worker_command

from .conftest import RedisServer
from .sitekit import Fault, SiteSpec, serving

ROOT = Path(__file__).resolve().parent.parent
SITEKIT = Path(__file__).with_name("sitekit.py")
runner = CliRunner()


def status(url: str, crawl: str, *extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["status", "--redis-url", url, "--crawl", crawl, *extra])
    return result.exit_code, result.output


def env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=fingerprint(url))


def polite_crawl(client: redis.Redis, crawl: str, **settings: object) -> FrontierCore:
    f = open_frontier(client, Settings(**settings), crawl)  # type: ignore[arg-type]
    assert f.politeness == "host"
    f.store_politeness(worker=True)
    return f


def test_status_shows_deferrals_blocks_and_politeness_wait(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    f = polite_crawl(redis7_client, "pol", politeness_delay=0.2, politeness_randomize=False)
    f.push([env(f"http://{h}.test/{i}") for h in "abc" for i in range(2)])
    got = {x.envelope.url: x for x in f.lease("w", 10)}
    assert sorted(got) == ["http://a.test/0", "http://b.test/0", "http://c.test/0"]
    assert f.defer(got["http://a.test/0"], "429", retry_after=600) == "deferred"
    assert f.defer(got["http://b.test/0"], "503", retry_after=600) == "deferred"
    f.ack([got["http://c.test/0"]])
    time.sleep(0.3)  # c.test's delay is over: its second request waited for it
    assert [x.envelope.url for x in f.lease("w", 10)] == ["http://c.test/1"]

    code, out = status(redis7.url, "pol", "--json")
    assert code == 0, out
    pol = json.loads(out)["politeness"]
    assert pol["key"] == "host"
    assert pol["deferred"] == {"429": 1, "503": 1}
    assert pol["blocked"] == 2  # a.test and b.test, for 600 s
    assert 0 < pol["wait_s"] < 60  # c.test was closed by its delay for about 0.2 s
    code, out = status(redis7.url, "pol")
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("politeness"))
    assert "one key per host" in line
    assert "deferred 2 (1 on 429, 1 on 503)" in line
    assert "keys blocked now: 2" in line
    assert f.counts().conserved


def test_status_of_a_crawl_without_politeness(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    f = open_frontier(redis7_client, Settings(politeness=False), "plain")
    f.push([env("http://a.test/")])
    code, out = status(redis7.url, "plain", "--json")
    assert code == 0, out
    assert json.loads(out)["politeness"] is None
    code, out = status(redis7.url, "plain")
    assert code == 0 and "politeness" not in out, out


def test_fleet_limits_in_words() -> None:
    text = fleet_limits(
        Settings(politeness_concurrency=2, politeness_delay=0.5, politeness_randomize=False)
    )
    assert "at most 2 requests at once per site (CONCURRENT_REQUESTS_PER_DOMAIN)" in text
    assert "one every 0.5 s (no jitter) (DOWNLOAD_DELAY)" in text
    assert "AutoThrottle off" in text and "robots" not in text
    assert "429/503 block the site for the fleet" in text
    text = fleet_limits(
        Settings(
            politeness_concurrency_per_ip=1,
            politeness_slots={"x": {"delay": 3}},
            autothrottle_enabled=True,
            defer_http_codes=(),
        ),
        robots=True,
    )
    assert "at most 1 request at once per site (CONCURRENT_REQUESTS_PER_IP), no delay" in text
    assert "1 key(s) with their own in DOWNLOAD_SLOTS" in text
    assert "AutoThrottle on, one delay per site for the fleet (start 5 s" in text
    assert "no deferral on 429/503" in text
    assert "robots.txt obeyed, fetched once per site for the fleet" in text
    assert "robots.txt not obeyed" in fleet_limits(Settings(), robots=False)


def test_a_worker_says_what_the_fleet_enforces_and_status_counts_its_deferral(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    """A plain ``scrapy runspider`` worker: its start INFO line gives the numbers; a
    429 with Retry-After from the site shows in ``redcrawl status``."""
    redis7_client.flushall()
    spec = SiteSpec(pages=4, links=3, faults={"/p/1": Fault(429, retry_after="1", times=1)})
    with serving([spec]) as kit:
        cmd = worker_command(
            SITEKIT,
            settings=[
                "CONCURRENT_REQUESTS_PER_DOMAIN=2",
                "DOWNLOAD_DELAY=0.1",
                "RANDOMIZE_DOWNLOAD_DELAY=False",
                "ROBOTSTXT_OBEY=False",
                "TELNETCONSOLE_ENABLED=False",
                "LOG_LEVEL=INFO",
                "REDCRAWL_IDLE_BEFORE_CLOSE=0.5",
            ],
            spider_args={"urls": kit.roots[0]},
        )
        environ = {
            **os.environ,
            "REDCRAWL_REDIS_URL": redis7.url,
            "REDCRAWL_CRAWL": "told",
            "PYTHONPATH": str(ROOT / "src"),
        }
        log = tmp_path / "w.log"
        with log.open("wb") as sink:
            proc = subprocess.run(
                cmd, env=environ, stdout=subprocess.DEVNULL, stderr=sink, cwd=tmp_path, timeout=120
            )
        text = log.read_text()
        assert proc.returncode == 0, text[-3000:]
        assert kit.fetched(kit.hosts[0])["/p/1"] == 2, text[-3000:]  # 429, then 200
    (line,) = [x for x in text.splitlines() if "fleet-wide politeness is on" in x]
    assert "one key per host" in line
    assert "at most 2 requests at once per site (CONCURRENT_REQUESTS_PER_DOMAIN)" in line
    assert "one every 0.1 s (no jitter) (DOWNLOAD_DELAY)" in line
    assert "AutoThrottle off" in line and "robots.txt not obeyed" in line
    assert "429/503 block the site for the fleet" in line
    code, out = status(redis7.url, "told", "--json")
    assert code == 0, out
    got = json.loads(out)
    assert got["finished"] and got["dead"] == 0
    assert got["politeness"]["deferred"] == {"429": 1}
    assert got["politeness"]["blocked"] == 0  # its 1 s block is over


def test_redcrawl_crawl_says_the_same_limits(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    from redcrawl.cli.run import _politeness

    redis7_client.flushall()
    settings = Settings(redis_url=redis7.url, politeness_concurrency=3, politeness_delay=1)
    text = _politeness(settings, "new", 4)
    assert text.startswith("per-site limits for the whole fleet (these 4 workers together")
    assert fleet_limits(settings) in text
    assert "at most 3 requests at once per site" in text and "one every 1 s (±50%)" in text


def test_redcrawl_crawl_says_the_limits_hold_on_the_streams_backend_too(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """The streams backend enforces the same fleet-wide limits (docs/politeness.md,
    "Streams backend"): `redcrawl crawl` must not tell a streams user they are not
    enforced (it did, from before streams had politeness)."""
    from redcrawl.cli.run import _politeness

    redis7_client.flushall()
    settings = Settings(
        redis_url=redis7.url, backend="streams", politeness_concurrency=2, politeness_delay=0.5
    )
    text = _politeness(settings, "new", 3)
    assert text.startswith("per-site limits for the whole fleet (these 3 workers together"), text
    assert "at most 2 requests at once per site" in text
