"""``ADDONS = {"redcrawl.scrapy.Addon": 0}`` (redcrawl.scrapy.addon): the Scrapy add-on
puts a project on redcrawl with one line, and says so when the project's own settings
keep another scheduler."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest
import redis
from scrapy.settings import Settings as ScrapySettings

from redcrawl.demo import ShopSite, SiteConfig
from redcrawl.redis_server import RedisServer
from redcrawl.scrapy import Addon, Scheduler
from redcrawl.workers import worker_command
from tests.scrapy_projects.harness import FAST, HERE, clean_env, frontier


class MyScheduler(Scheduler):
    pass


def test_the_addon_sets_redcrawls_scheduler_and_dupefilter() -> None:
    settings = ScrapySettings()
    Addon().update_settings(settings)
    assert settings["SCHEDULER"] == "redcrawl.scrapy.Scheduler"
    assert settings["DUPEFILTER_CLASS"] == "redcrawl.scrapy.DupeFilter"
    # local feed files flushed after each item (test_crawl_output.py kills a worker);
    # a project's own FEED_STORAGES still wins, the other schemes are Scrapy's
    storages = settings.getwithbase("FEED_STORAGES")
    assert storages["file"] == storages[""] == "redcrawl.scrapy.feed_storage.FlushedFileFeedStorage"
    assert storages["s3"] == "scrapy.extensions.feedexport.S3FeedStorage"
    settings.set("FEED_STORAGES", {"file": "my.Storage"}, "project")
    assert settings.getwithbase("FEED_STORAGES")["file"] == "my.Storage"


@pytest.mark.parametrize("overwrite", [False, True])
def test_the_flushed_feed_storage_has_each_item_in_the_file_before_close(
    tmp_path: Path, overwrite: bool
) -> None:
    """On every Scrapy of the matrix (its FileFeedStorage's signature and write mode):
    what an exporter wrote is in the file at once, not in a buffer a SIGKILL loses."""
    from scrapy.exporters import JsonLinesItemExporter

    from redcrawl.scrapy.feed_storage import FlushedFileFeedStorage

    path = tmp_path / "new" / "items.jsonl"
    path.parent.mkdir()
    path.write_text('{"url": "earlier"}\n')
    storage = FlushedFileFeedStorage(str(path), feed_options={"overwrite": overwrite})
    file = storage.open(None)
    exporter = JsonLinesItemExporter(file)  # type: ignore[arg-type]  # (any binary file)
    exporter.start_exporting()
    exporter.export_item({"url": "a"})
    before = [] if overwrite else ['{"url": "earlier"}']
    assert path.read_text().splitlines() == [*before, '{"url": "a"}']
    exporter.finish_exporting()
    storage.store(file)
    assert path.read_text().splitlines() == [*before, '{"url": "a"}']


def test_a_project_scheduler_that_is_not_redcrawls_is_kept_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = ScrapySettings()
    settings.set("SCHEDULER", "scrapy_redis.scheduler.Scheduler", "project")
    with caplog.at_level(logging.WARNING):
        Addon().update_settings(settings)
    assert settings["SCHEDULER"] == "scrapy_redis.scheduler.Scheduler"  # the project wins
    assert "SCHEDULER = 'scrapy_redis.scheduler.Scheduler'" in caplog.text
    assert "remove that line" in caplog.text


def test_a_subclass_of_redcrawls_scheduler_is_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = ScrapySettings()
    settings.set("SCHEDULER", f"{__name__}.MyScheduler", "project")
    with caplog.at_level(logging.WARNING):
        Addon().update_settings(settings)
    assert caplog.text == ""


@pytest.mark.slow
def test_a_crawl_with_the_addon_alone_runs_on_the_frontier(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """No SCHEDULER or DUPEFILTER_CLASS anywhere: only the add-on."""
    config = SiteConfig(products=20, per_page=10, categories=2, tracking_params=False)
    with ShopSite(config) as site:
        cmd = worker_command(
            HERE / "shop_spider.py",
            settings={
                **FAST,
                "REDCRAWL_REDIS_URL": redis7.url,
                "REDCRAWL_CRAWL": "addon",
                "RC_TEST_OUT": str(tmp_path / "out.json"),
                "ADDONS": json.dumps({"redcrawl.scrapy.Addon": 0}),
            },
            spider_args={"url": site.url + "/"},
            redcrawl=False,
        )
        assert not any("SCHEDULER" in part for part in cmd), cmd
        done = subprocess.run(
            cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        pages = site.canonical_pages()
        assert set(site.hits()) == pages
    counts = frontier(redis7_client, "addon").counts()
    assert counts.finished and counts.done == len(pages), counts
