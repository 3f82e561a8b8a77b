"""``redcrawl crawl -o FILE`` / ``-O FILE`` (redcrawl.feeds): a stranger's ``-o`` from
``scrapy crawl`` gives a feed file per worker. Seen before: ``No such option: -o``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.feeds import WORKER_TOKEN, for_worker, output_problem, per_worker, remove_parts
from redcrawl.frontier import open_frontier
from redcrawl.redis_server import RedisServer
from redcrawl.settings import Settings
from tests.test_workers import cli_env, processes_with, wait_until

SPIDER = """
import scrapy


class Items(scrapy.Spider):
    name = "items"

    def __init__(self, url=None, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [url]

    def parse(self, response):
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
        yield {"url": response.url}
"""


@pytest.mark.parametrize(
    ("output", "worker_file"),
    [
        ("items.jsonl", "items.w1.jsonl"),
        ("out/items.csv", "out/items.w1.csv"),
        ("items.json:jsonlines", "items.w1.json:jsonlines"),
        ("items:jsonlines", "items.w1:jsonlines"),
        ("file:///tmp/x/items.jsonl", "file:///tmp/x/items.w1.jsonl"),
        ("s3://bucket/feeds/items.jsonl", "s3://bucket/feeds/items.w1.jsonl"),
        ("out.d/items.tar.jsonl", "out.d/items.tar.w1.jsonl"),
    ],
)
def test_each_worker_gets_a_file_of_its_own(output: str, worker_file: str) -> None:
    assert WORKER_TOKEN in per_worker(output)
    assert for_worker(output, "w1") == worker_file
    assert output_problem(output) is None


@pytest.mark.parametrize("output", ["-", "stdout:", "stdout:jsonlines", "items", "out/items"])
def test_outputs_the_workers_cannot_each_have_are_refused_with_the_fix(output: str) -> None:
    problem = output_problem(output)
    assert problem is not None and "items.jsonl" in problem, problem


def test_overwrite_removes_every_workers_file_of_an_earlier_run_and_nothing_else(
    tmp_path: Path,
) -> None:
    names = ["items.w0.jsonl", "items.w12.jsonl", "items.jsonl", "items.wx.jsonl", "other.w0.jsonl"]
    for name in names:
        (tmp_path / name).write_text("{}\n")
    removed = remove_parts("items.jsonl", cwd=tmp_path)
    assert sorted(p.name for p in removed) == ["items.w0.jsonl", "items.w12.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "items.jsonl",
        "items.wx.jsonl",
        "other.w0.jsonl",
    ]
    assert remove_parts("s3://bucket/items.jsonl", cwd=tmp_path) == []


def _crawl(tmp_path: Path, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "redcrawl.cli", "crawl", *args, "--no-progress"],
        cwd=tmp_path,
        env={**cli_env(redis_url), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=150,
    )


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_crawl_o_writes_every_item_once_over_the_workers_files(
    tmp_path: Path, redis7: RedisServer
) -> None:
    redis.Redis.from_url(redis7.url).flushall()
    spider = tmp_path / "items_spider.py"
    spider.write_text(SPIDER)
    # an earlier run's files: -O removes them all, a worker number this run has not too
    (tmp_path / "items.w0.jsonl").write_text('{"url": "stale"}\n')
    (tmp_path / "items.w5.jsonl").write_text('{"url": "stale"}\n')
    config = SiteConfig(products=30, per_page=10, categories=2, tracking_params=False)
    with ShopSite(config) as site:
        base = ["-w", "2", "--crawl", "items", "--arg", f"url={site.url}/"]
        for args, why in [
            (["-o", "-"], "standard output goes to their logs"),
            (["-o", "items"], "give the file an extension"),
            (["-o", "a.jsonl", "-O", "b.jsonl"], "only one of -o/--output and -O"),
        ]:
            refused = _crawl(tmp_path, redis7.url, str(spider), *base, *args)
            out = refused.stdout + refused.stderr
            assert refused.returncode == 2 and why in out, out
        done = _crawl(tmp_path, redis7.url, str(spider), *base, "-O", "items.jsonl")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        said = done.stdout + done.stderr
        assert "items: items.w0.jsonl ... items.w1.jsonl (a file per worker)" in said, said
        assert "-O: removed items.w5.jsonl" in said, said
        fetched = set(site.hits())
        root = site.url
    files = sorted(p.name for p in tmp_path.glob("items*.jsonl"))
    assert files == ["items.w0.jsonl", "items.w1.jsonl"], files
    urls = [
        json.loads(line)["url"]
        for name in files
        for line in (tmp_path / name).read_text().splitlines()
    ]
    assert len(urls) == len(set(urls)), "an item written twice"
    assert {u.removeprefix(root) for u in urls} == fetched


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_sigkilled_worker_loses_no_item_of_its_feed(tmp_path: Path, redis7: RedisServer) -> None:
    """Found by SIGKILLing a worker of ``redcrawl crawl -o items.jsonl``: its file lacked
    the last items of the pages it had finished (Scrapy's feed file is buffered, the
    requests were acknowledged), and the restart did not bring them back: 159 of 175
    items. A worker's feed file now gets each item before its request is acknowledged;
    a request fetched again after the kill may write its item twice, never none."""
    redis.Redis.from_url(redis7.url).flushall()
    spider = tmp_path / "items_spider.py"
    spider.write_text(SPIDER)
    config = SiteConfig(products=120, per_page=10, categories=2, tracking_params=False)
    frontier_client = redis.Redis.from_url(redis7.url)
    with ShopSite(config) as site:
        cmd = [sys.executable, "-m", "redcrawl.cli", "crawl", str(spider), "-w", "2"]
        cmd += ["--crawl", "killfeed", "--arg", f"url={site.url}/", "-o", "items.jsonl"]
        cmd += ["--set", "DOWNLOAD_DELAY=0.02", "--set", "CONCURRENT_REQUESTS=2"]
        cmd += ["--no-progress"]
        out = tmp_path / "out.txt"
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                cmd, cwd=tmp_path, env=cli_env(redis7.url), stdout=sink, stderr=subprocess.STDOUT
            )
            frontier = open_frontier(frontier_client, Settings(), "killfeed")
            wait_until(lambda: frontier.counts().done >= 40, proc, out)
            victims = processes_with("-m scrapy ", site.url)
            assert len(victims) == 2, victims
            os.kill(victims[0], signal.SIGKILL)
            code = proc.wait(timeout=180)
        text = out.read_text(errors="replace")
        assert code == 0 and "was killed by SIGKILL; restarting it" in text, text[-3000:]
        fetched = set(site.hits())
        root = site.url
    urls = {
        json.loads(line)["url"].removeprefix(root)
        for name in ("items.w0.jsonl", "items.w1.jsonl")
        for line in (tmp_path / name).read_text().splitlines()
    }
    assert fetched - urls == set(), f"{len(fetched - urls)} fetched pages without an item"
