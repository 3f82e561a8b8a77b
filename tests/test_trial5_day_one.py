"""Day-one bugs found by moving real third-party projects onto redcrawl as a stranger
would (trial 5: rmax/scrapy-redis's example-project with its two class paths changed, as
the README says, and scrapy/quotesbot with the add-on): real ``scrapy runspider``
workers on a redis-server of the test session, against the demo shop site. Each test
says what was seen before the fix."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from scrapy.settings import Settings as ScrapySettings

from redcrawl.codec import Envelope
from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.fingerprint import fingerprint
from redcrawl.redis_server import RedisServer
from redcrawl.settings import startup_warnings
from tests.conftest import need_module
from tests.scrapy_projects.harness import finished_state, frontier, run_spider
from tests.test_workers import cli_env

SHOP_SPIDER = Path(__file__).parent / "scrapy_projects" / "shop_spider.py"

pytestmark = pytest.mark.slow

SITE = SiteConfig(products=6, per_page=3, categories=1, tracking_params=False)
SITE_URL = "http://127.0.0.1:9/page"
WORKER = {"CONCURRENT_REQUESTS": 4, "REDCRAWL_POLITENESS": "off"}


def redcrawl_lines(log: str, level: str) -> list[str]:
    """redcrawl's log lines of ``level``."""
    return [line for line in log.splitlines() if re.search(rf"\[redcrawl[\w.]*\] {level}:", line)]


def test_scrapy_redis_item_pipeline_left_in_settings_is_warned_about(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """scrapy-redis's example-project keeps ``scrapy_redis.pipelines.RedisPipeline`` in
    ITEM_PIPELINES. With redcrawl on its embedded Redis (or on REDCRAWL_REDIS_URL only),
    that pipeline writes to scrapy-redis's default, localhost:6379, where nothing may
    listen: seen before, every item failed, every page was fetched 3 times and all 48 of
    53 pages with items went to the dead letters, without a word at start. Now one
    WARNING at start names the pipeline and where it writes."""
    need_module("scrapy_redis", "pip install -e '.[test]'")
    with ShopSite(SITE) as site:
        run = run_spider(
            "shop_spider.py",  # yields no item: nothing is written to localhost:6379
            tmp_path,
            redis_url=redis7.url,
            crawl="t5pipe",
            settings={**WORKER, "ITEM_PIPELINES": '{"scrapy_redis.pipelines.RedisPipeline": 400}'},
            args={"url": site.url + "/"},
        ).ok()
    warned = [line for line in redcrawl_lines(run.stderr, "WARNING") if "RedisPipeline" in line]
    assert len(warned) == 1, run.tail()
    assert "localhost:6379" in warned[0] and "REDIS_URL" in warned[0], warned


def test_scrapy_redis_pipeline_warning_follows_scrapy_redis_settings() -> None:
    """The warning is given only when the pipeline would not write to the crawl's Redis:
    not when the project names scrapy-redis's Redis (REDIS_URL, REDIS_HOST/PORT), which
    both then use."""
    pipes: dict[str, object] = {"ITEM_PIPELINES": {"scrapy_redis.pipelines.RedisPipeline": 400}}

    def warned(values: dict[str, object], env: dict[str, str]) -> list[str]:
        found = startup_warnings(ScrapySettings(values, priority="project"), environ=env)
        return [w for w in found if "RedisPipeline" in w]

    assert len(warned(pipes, {})) == 1  # embedded Redis
    assert len(warned(pipes, {"REDCRAWL_REDIS_URL": "redis://10.0.0.5:6379"})) == 1
    assert warned({**pipes, "REDIS_URL": "redis://10.0.0.5:6379"}, {}) == []
    assert warned({**pipes, "REDIS_HOST": "10.0.0.5"}, {}) == []
    assert warned(pipes, {"REDCRAWL_REDIS_URL": "redis://localhost:6379"}) == []
    assert warned({"ITEM_PIPELINES": {"myproject.pipelines.Store": 300}}, {}) == []


FAILING_SPIDER = """
import scrapy

class FailingPipeline:
    def process_item(self, item, *args):  # Scrapy < 2.13 passes the spider too
        raise ConnectionError("[Errno 111] connecting to localhost:6379: Connection refused")

class ItemsSpider(scrapy.Spider):
    name = "items"
    custom_settings = {
        "ITEM_PIPELINES": {"t5_failing_spider.FailingPipeline": 300},
        "EXTENSIONS": {"rc_testkit.Report": 500},
    }

    def __init__(self, url=None, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [url]

    def parse(self, response):
        yield {"url": response.url}
"""


def test_a_request_that_goes_to_the_dead_letters_is_said_so(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """A page whose item pipeline always fails is retried, then dead-lettered. Seen before:
    each attempt logged ``failed URL (attempt N): item pipeline error: ...`` at INFO, the
    last one too, and nothing said the request was now dead (nor where to see it): the
    user saw a crawl 'finished' with 48 of 53 pages dead. Now the last attempt's line is
    a WARNING that says it went to the dead letters, after how many attempts, and how to
    list and requeue them."""
    spider = tmp_path / "t5_failing_spider.py"
    spider.write_text(textwrap.dedent(FAILING_SPIDER))
    with ShopSite(SITE) as site:
        root = site.url + "/"
        run = run_spider(
            str(spider),
            tmp_path,
            redis_url=redis7.url,
            crawl="t5dead",
            settings={**WORKER, "REDCRAWL_MAX_ATTEMPTS": 2},
            args={"url": root},
        )
    assert run.returncode == 0, run.tail()
    counts = frontier(redis7_client, "t5dead").counts()
    assert counts.dead == 1 and counts.finished, counts
    dead = [line for line in redcrawl_lines(run.stderr, "WARNING") if "dead letters" in line]
    assert len(dead) == 1, run.tail()
    assert root in dead[0] and "2 attempts" in dead[0], dead
    assert "REDCRAWL_MAX_ATTEMPTS" in dead[0] and "redcrawl dead" in dead[0], dead
    assert "item pipeline error" in dead[0], dead
    retried = [line for line in redcrawl_lines(run.stderr, "INFO") if "failed " in line]
    assert len(retried) == 1 and "(attempt 1)" in retried[0], retried


def test_a_worker_resuming_an_unfinished_crawl_says_so(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """scrapy-redis's example-project README: stop `scrapy crawl dmoz`, run it again and
    see `Resuming crawl (9019 requests scheduled)`. Seen before: redcrawl said a finished
    crawl was finished, but nothing when it resumed one (the second run's log looked
    like a fresh crawl's). Now one INFO line with what is left; none on a new crawl."""
    big = SiteConfig(products=40, per_page=4, categories=2, tracking_params=False)
    settings = {**WORKER, "CONCURRENT_REQUESTS": 1, "CLOSESPIDER_PAGECOUNT": 3}
    with ShopSite(big) as site:
        first = run_spider(
            "shop_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="t5resume",
            tag="first",
            settings=settings,
            args={"url": site.url + "/"},
        )
        left = frontier(redis7_client, "t5resume").counts()
        second = run_spider(
            "shop_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="t5resume",
            tag="second",
            settings=settings,
            args={"url": site.url + "/"},
        )
    assert first.returncode == 0 and second.returncode == 0, second.tail()
    assert left.pending > 0 and not left.finished, left
    assert not [line for line in first.stderr.splitlines() if "resuming crawl" in line]
    [line] = [line for line in redcrawl_lines(second.stderr, "INFO") if "resuming crawl" in line]
    assert f"{left.pending} request(s) left" in line and f"{left.done} done" in line, line


def test_redcrawl_crawl_ending_with_dead_letters_says_where_they_are(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """`redcrawl crawl` of the example-project with RedisPipeline left in: seen before, it
    ended with exit 0 and a table with `dead 48` in it, not a word more (the workers'
    WARNINGs are in their logs). Now one line says how many, the first one's error and
    the command that lists them (the exit code stays 0 without --fail-on-dead)."""
    spider = tmp_path / "t5_failing_spider.py"
    spider.write_text(
        textwrap.dedent(FAILING_SPIDER).replace('"EXTENSIONS": {"rc_testkit.Report": 500},', "")
    )
    with ShopSite(SITE) as site:
        cmd = [
            sys.executable,
            "-m",
            "redcrawl.cli",
            "crawl",
            str(spider),
            "-w",
            "1",
            "--crawl",
            "t5cli",
            "--arg",
            f"url={site.url}/",
            "--set",
            "REDCRAWL_MAX_ATTEMPTS=1",
            "--set",
            "REDCRAWL_POLITENESS=off",
            "--no-progress",
        ]
        env = {**cli_env(redis7.url), "COLUMNS": "400"}
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=100)
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, out[-3000:]
    [line] = [line for line in out.splitlines() if "dead letter" in line]
    assert line.startswith("1 dead letter"), line
    assert "redcrawl dead --crawl t5cli" in line and "item pipeline error" in line, line
    assert "[Errno 111]" in line, line  # the error as it is, not read as rich markup


def test_fail_on_dead_counts_the_dead_letters_a_persist_off_crawl_removed(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """A review found `--fail-on-dead` exiting 0 with SCHEDULER_PERSIST = False: the last
    worker had removed the crawl's state, dead letters included, and the command read
    the dead count from Redis after that (0). Now the last count seen while it ran."""
    spider = tmp_path / "t5_failing_spider.py"
    spider.write_text(
        textwrap.dedent(FAILING_SPIDER).replace('"EXTENSIONS": {"rc_testkit.Report": 500},', "")
    )
    with ShopSite(SITE) as site:
        cmd = [sys.executable, "-m", "redcrawl.cli", "crawl", str(spider), "-w", "1"]
        cmd += ["--crawl", "t5deadoff", "--arg", f"url={site.url}/", "--fail-on-dead"]
        for item in ("REDCRAWL_MAX_ATTEMPTS=1", "REDCRAWL_POLITENESS=off"):
            cmd += ["--set", item]
        cmd += ["--set", "SCHEDULER_PERSIST=False", "--no-progress"]
        env = {**cli_env(redis7.url), "COLUMNS": "400"}
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=100)
    out = done.stdout.decode() + done.stderr.decode()
    assert frontier(redis7_client, "t5deadoff").counts().accepted == 0  # removed
    assert done.returncode == 4, out[-3000:]
    assert "removed with the crawl's state" in out, out[-3000:]


def test_fail_on_dead_counts_a_removed_crawls_dead_letters_the_progress_never_saw(
    redis7: RedisServer, redis7_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """The test above failed in a CI run under load: the whole crawl (one page, its dead
    letter and the removal) ran between two progress reads, so the command had no count
    "as last seen" and exited 0 with a table of zeros. The last worker now leaves the
    finished crawl's counts (with a day's expiry) before it removes the state, and the
    command reports those. Here, the end of a run whose progress saw nothing."""
    from redcrawl.cli.run import _report_end
    from redcrawl.frontier.final import server_ms, write_final
    from redcrawl.settings import Settings
    from redcrawl.workers import FleetResult, Tick

    settings = Settings(redis_url=redis7.url, persist=False)
    f = frontier(redis7_client, "t5unseen")
    f.push([Envelope(url=SITE_URL, fingerprint=fingerprint(SITE_URL))])
    (lease,) = f.lease("w", 1)
    assert f.nack(lease, "item pipeline error", retry=False) == "dead"
    counts, stats = f.counts(), f.stats()
    started = server_ms(f.client)  # (the command's start)
    f.purge()
    write_final(f.client, f.keys, counts, stats)  # what the last worker's close does
    result = FleetResult(returncodes=[0], restarts=0, signal=None, logs=[])
    assert _report_end(settings, "t5unseen", result, [], None, True, started) == 4
    # counts kept by an earlier run (before this command started) are not this run's: what
    # the progress saw instead ("as last seen"), else Redis's (empty), exit 0
    later = server_ms(f.client) + 1
    tick = Tick(counts=replace(counts, dead=2), stats=stats, elapsed=3.0, running=1)
    capsys.readouterr()
    assert _report_end(settings, "t5unseen", result, [tick], None, True, later) == 4
    said = " ".join("".join(capsys.readouterr()).split())
    assert "2 dead letter(s) as last seen" in said, said[-400:]
    assert _report_end(settings, "t5unseen", result, [], None, True, later) == 0


def test_redcrawl_crawl_with_persist_off_reports_what_it_did(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """A scrapy-redis project with SCHEDULER_PERSIST = False run with `redcrawl crawl -w 2`:
    its last worker removes the crawl's state at the end, as documented. Seen before: the
    command then ended with a table of zeros, state 'empty (nothing accepted; no live
    workers)', after crawling 53 pages: it looked as if nothing had been crawled. Now it
    says the state was removed (SCHEDULER_PERSIST off) and shows the last counts it saw."""
    with ShopSite(SITE) as site:
        pages = len(site.canonical_pages())
        cmd = [
            sys.executable,
            "-m",
            "redcrawl.cli",
            "crawl",
            str(SHOP_SPIDER),
            "-w",
            "2",
            "--crawl",
            "t5persist",
            "--arg",
            f"url={site.url}/",
            "--set",
            "SCHEDULER_PERSIST=False",
            "--set",
            "REDCRAWL_POLITENESS=off",
            "--no-progress",
        ]
        env = {**cli_env(redis7.url), "COLUMNS": "400"}
        env["PYTHONPATH"] += os.pathsep + str(SHOP_SPIDER.parent)  # its rc_testkit
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=100)
        hits = site.hits()
        assert set(hits) == site.canonical_pages(), hits
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, out[-3000:]
    assert frontier(redis7_client, "t5persist").counts().accepted == 0  # removed, as documented
    assert "nothing accepted" not in out, out[-3000:]
    assert "SCHEDULER_PERSIST is off" in out, out[-3000:]
    # the counts its last worker left as it removed the state (exact), not as last seen
    assert "as that worker left them" in " ".join(out.split()), out[-3000:]
    [accepted] = [line for line in out.splitlines() if "│ accepted" in line]
    assert int(accepted.split("│")[2].strip().replace(",", "")) == pages, accepted


def test_a_stored_request_whose_callback_is_gone_is_said_when_dead_lettered(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """A crawl stopped, its spider's callback renamed (or a scrapy-redis crawl imported
    whose callbacks this spider lacks), then resumed: the stored request cannot be
    rebuilt and goes to the dead letters at once, by design. Seen before: without a
    single log line (only the stats' `redcrawl/dead`); now a WARNING names the URL, the
    reason and `redcrawl dead`."""
    with ShopSite(SITE) as site:
        root = site.url + "/"
        gone = f"{site.url}/category/0"
        f = frontier(redis7_client, "t5gone")
        f.push(
            [
                Envelope(url=url, callback="parse_old_name", fingerprint=fingerprint(url))
                for url in (gone, gone + "?page=2", gone + "?page=3")
            ]
        )
        run = run_spider(
            "shop_spider.py",
            tmp_path,
            redis_url=redis7.url,
            crawl="t5gone",
            settings={"CONCURRENT_REQUESTS": 4},  # politeness on, as the crawl made above
            args={"url": root},
        ).ok()
    counts = f.counts()
    assert counts.dead == 3 and counts.finished, counts
    # the first at WARNING, the others of the same reason at DEBUG (no flood)
    dead = [line for line in redcrawl_lines(run.stderr, "WARNING") if "dead letters" in line]
    assert len(dead) == 1, run.tail()
    assert gone in dead[0] and "parse_old_name" in dead[0] and "redcrawl dead" in dead[0], dead


def crawlspider_entries() -> tuple[bytes, bytes, str, str]:
    """Two scrapy-redis 0.9.1 queue entries, as its CrawlSpider's requests are: meta
    ``link_text`` is what lxml's link extractor gives, an ``_ElementUnicodeResult`` (a
    str subclass), which pickle stores by class. One plain entry beside it. With their
    scrapy-redis fingerprints (hex, as in its dupefilter)."""
    from scrapy import Request
    from scrapy.http import HtmlResponse
    from scrapy.linkextractors import LinkExtractor

    from tests.test_import_scrapy_redis import sr_entry, sr_fingerprint

    page = HtmlResponse("http://a.example/", body=b'<a href="/cat1/">Cat 1</a>', encoding="utf-8")
    [link] = LinkExtractor().extract_links(page)
    assert type(link.text).__name__ == "_ElementUnicodeResult", type(link.text)
    lxml_entry = sr_entry(Request(link.url, meta={"rule": 0, "link_text": link.text}))
    plain_entry = sr_entry(Request("http://a.example/cat2/", meta={"rule": 0}))
    return (
        lxml_entry,
        plain_entry,
        sr_fingerprint(link.url),
        sr_fingerprint("http://a.example/cat2/"),
    )


def import_cmd(redis_url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "redcrawl.cli", "import-scrapy-redis", "dmoz", *extra]


def test_import_with_unreadable_queue_entries_writes_nothing(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """scrapy-redis's example-project, its dmoz CrawlSpider stopped mid-crawl, then
    `redcrawl import-scrapy-redis dmoz` as docs/scrapy.md says. Seen before: all 18
    queued requests refused (their meta's lxml string), and the dupefilter's 52 members
    marked done, the refused requests' own among them (their fingerprints could not be
    read): exit 1, but the crawl then ran to 'finished' without ever fetching those 18
    pages. Now an import that would refuse any queued request writes nothing (exit 1,
    saying why); --partial imports the rest knowing the loss. The lxml string is read
    now (the test below): the unreadable entry here holds an object in its meta."""
    need_module("scrapy_redis", "pip install -e '.[test]'")
    from datetime import datetime

    from scrapy import Request

    from tests.test_import_scrapy_redis import sr_entry, sr_fingerprint

    _, plain_entry, _, plain_fp = crawlspider_entries()
    bad_url = "http://a.example/cat1/"
    bad_entry = sr_entry(Request(bad_url, meta={"rule": 0, "seen": datetime(2024, 1, 1)}))
    bad_fp, done_fp = sr_fingerprint(bad_url), "ab" * 20
    redis7_client.zadd("dmoz:requests", {bad_entry: 0, plain_entry: 0})
    redis7_client.sadd("dmoz:dupefilter", bad_fp, plain_fp, done_fp)
    env = cli_env(redis7.url)
    done = subprocess.run(
        import_cmd(redis7.url), cwd=tmp_path, env=env, capture_output=True, timeout=60
    )
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 1, out
    assert "nothing imported" in out and "--partial" in out, out
    f = frontier(redis7_client, "dmoz")
    assert f.counts().accepted == 0, f.counts()
    assert f.done.contains([bytes.fromhex(bad_fp), bytes.fromhex(done_fp)]) == [False, False]
    assert redis7_client.zcard("dmoz:requests") == 2  # the source is only read
    # --partial: the old behaviour, said: the readable request queued, the rest done
    done = subprocess.run(
        import_cmd(redis7.url, "--partial"), cwd=tmp_path, env=env, capture_output=True, timeout=60
    )
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 1, out
    assert f.counts().ready == 1, f.counts()


def test_import_reads_crawlspider_requests(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """Every scrapy-redis CrawlSpider queue holds requests whose meta ``link_text`` is an
    lxml string: they must import as plain strings, not be refused."""
    need_module("scrapy_redis", "pip install -e '.[test]'")
    from redcrawl.migrate import import_scrapy_redis

    lxml_entry, plain_entry, _, _ = crawlspider_entries()
    redis7_client.zadd("dmoz:requests", {lxml_entry: 0, plain_entry: 0})
    f = frontier(redis7_client, "dmoz")
    result = import_scrapy_redis(redis7_client, f, "dmoz")
    assert (result.refused, result.pushed) == (0, 2), result.examples
    metas = [lease.envelope.meta for lease in f.lease("w", 10)]
    assert {"rule": 0, "link_text": "Cat 1"} in metas, metas
    assert all(type(m.get("link_text", "")) is str for m in metas), metas


def test_a_worker_opening_after_its_siblings_finished_the_crawl_is_not_told_to_purge(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """`redcrawl crawl toscrape-css -w 2` (quotesbot, 10 pages on a fast local site): w1
    crawled all 10 pages before w0's spider opened, and w0 logged a WARNING 'crawl is
    finished: 10 done; use `redcrawl purge` or `--recrawl` to crawl again' in a fresh
    crawl. When another worker of the crawl is alive it is said at INFO, without the
    advice; with none alive (a finished crawl run again) the WARNING stays."""
    urls = ["http://a.example/1", "http://a.example/2"]
    finished_state(redis7_client, "t5sib", *urls)
    f = frontier(redis7_client, "t5sib")
    f.renew("sibling-still-closing", ttl=60)  # a live worker of the crawl
    run = run_spider(
        "shop_spider.py", tmp_path, redis_url=redis7.url, crawl="t5sib", tag="sib"
    ).ok()
    assert not [line for line in redcrawl_lines(run.stderr, "WARNING") if "purge" in line]
    said = [line for line in redcrawl_lines(run.stderr, "INFO") if "other live worker" in line]
    assert len(said) == 1 and "is finished: 2 done" in said[0], run.tail()
    redis7_client.hdel(f.keys.workers, "sibling-still-closing")
    run = run_spider(
        "shop_spider.py", tmp_path, redis_url=redis7.url, crawl="t5sib", tag="alone"
    ).ok()
    [warned] = [line for line in redcrawl_lines(run.stderr, "WARNING") if "is finished" in line]
    assert "redcrawl purge" in warned, warned
