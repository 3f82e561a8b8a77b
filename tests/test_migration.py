"""Migrating a scrapy-redis project: change the class paths, nothing else.

tests/scrapy_projects/srproj/ is a small project written for scrapy-redis (its settings
use scrapy-redis's names: REDIS_URL, SCHEDULER_PERSIST, SCHEDULER_QUEUE_CLASS,
REDIS_START_URLS_KEY, MAX_IDLE_TIME_BEFORE_CLOSE, ...), with a RedisSpider and a
RedisCrawlSpider. The tests run it as-is on scrapy-redis, then a copy of it where only
the scheduler, dupefilter and spider base-class paths were replaced (textually) on
redcrawl, each in a subprocess against a real Redis 7 and the demo shop site.
"""

from __future__ import annotations

import difflib
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from redcrawl.demo import ShopSite, SiteConfig
from tests.conftest import RedisServer
from tests.scrapy_projects.harness import HERE, Run, Worker, clean_env, crawl_keys, frontier

PROJECT = HERE / "srproj"
CLASS_PATHS = {
    '"scrapy_redis.scheduler.Scheduler"': '"redcrawl.scrapy.Scheduler"',
    '"scrapy_redis.dupefilter.RFPDupeFilter"': '"redcrawl.scrapy.DupeFilter"',
    "from scrapy_redis.spiders import": "from redcrawl.scrapy import",
}
SITE = SiteConfig(products=12, per_page=4, categories=2, tracking_params=False)
"""17 pages: home, 4 listing pages, 12 products."""
FANOUT = [3, 1, 5, 2, 4]
"""Priorities of the requests the JSON start entry's page adds (to /product/10<p>, 404s),
in the order the callback yields them."""
BY_PRIORITY = [f"/product/{100 + p}" for p in sorted(FANOUT, reverse=True)]


@pytest.fixture
def migrated(tmp_path: Path) -> Path:
    """A copy of the project with only the class paths changed (checked line by line)."""
    dst = tmp_path / "migrated"
    shutil.copytree(PROJECT, dst, ignore=shutil.ignore_patterns("__pycache__"))
    changed: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(dst.rglob("*")):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        new = text
        for old, replacement in CLASS_PATHS.items():
            new = new.replace(old, replacement)
        if new == text:
            continue
        path.write_text(new, encoding="utf-8")
        diff = list(difflib.ndiff(text.splitlines(), new.splitlines()))
        removed = [line[2:] for line in diff if line.startswith("- ")]
        added = [line[2:] for line in diff if line.startswith("+ ")]
        changed[str(path.relative_to(dst))] = list(zip(removed, added, strict=True))
    assert sorted(changed) == [
        "srproj/settings.py",
        "srproj/spiders/rules.py",
        "srproj/spiders/shop.py",
    ]
    pairs = [pair for file_pairs in changed.values() for pair in file_pairs]
    assert len(pairs) == 4  # SCHEDULER, DUPEFILTER_CLASS and two spider imports
    for old, new in pairs:
        assert sum(o in old for o in CLASS_PATHS) == 1 and new != old
    return dst


@pytest.fixture
def site() -> Iterator[ShopSite]:
    with ShopSite(SITE) as s:
        yield s


def start_project(project: Path, spider: str, redis_url: str, out_dir: Path, **env: str) -> Worker:
    """``scrapy crawl <spider>`` inside the project, its REDIS_URL from the environment."""
    out = out_dir / f"{project.name}-{spider}.json"
    return Worker(
        [sys.executable, "-m", "scrapy", "crawl", spider],
        out,
        cwd=project,
        env=clean_env(SRPROJ_REDIS_URL=redis_url, SRPROJ_REPORT=str(out), **env),
    )


def push_srspider_entries(client: redis.Redis, site: ShopSite) -> None:
    """A plain URL and a JSON entry with meta, LPUSHed as scrapy-redis users do."""
    client.lpush("srspider:start_urls", site.url + "/")
    client.lpush(
        "srspider:start_urls",
        json.dumps(
            {
                "url": site.url + "/category/2?page=1",
                "meta": {"source": "feed", "fanout": FANOUT},
            }
        ),
    )


def fanout_order(run: Run) -> list[str]:
    """The fan-out pages' paths, in the order they were fetched."""
    return [p for p in ("/" + u.split("/", 3)[3] for u in run.urls) if p in BY_PRIORITY]


def popped_by_priority(order: list[str]) -> bool:
    """Whether a priority queue gives ``order`` when the fan-out requests are pushed in the
    callback's order and popped at any time in between: each page fetched is the highest
    priority pushed by then. (Scrapy may fetch the first one before the callback yielded
    the rest: its scraper hands on spider output in 10 ms slices.) The yield order itself
    is refused, since a FIFO queue gives it too."""
    pushed = [f"/product/{100 + p}" for p in FANOUT]
    if sorted(order) != sorted(pushed) or order == pushed:
        return False
    waiting: list[int] = []
    next_push = 0
    for path in order:
        prio = int(path.rsplit("/", 1)[1]) - 100
        while prio not in waiting:
            waiting.append(FANOUT[next_push])
            next_push += 1
        if prio != max(waiting):
            return False
        waiting.remove(prio)
    return True


def test_popped_by_priority() -> None:
    assert popped_by_priority(BY_PRIORITY)
    assert popped_by_priority([f"/product/{100 + p}" for p in (3, 5, 4, 2, 1)])  # CI, 2.11
    assert not popped_by_priority([f"/product/{100 + p}" for p in FANOUT])  # FIFO
    assert not popped_by_priority([f"/product/{100 + p}" for p in reversed(FANOUT)])  # LIFO
    assert not popped_by_priority([f"/product/{100 + p}" for p in (5, 1, 4, 3, 2)])
    assert not popped_by_priority(BY_PRIORITY[:-1])


def check_srspider_run(run: Run, site: ShopSite) -> None:
    """What both schedulers must do with srspider."""
    assert popped_by_priority(fanout_order(run)), fanout_order(run)  # PriorityQueue
    assert run.report["spider"]["meta"] == [[site.url + "/category/2?page=1", "feed"]]
    assert set(site.hits()) == site.canonical_pages() | set(BY_PRIORITY)


# --- (a) the project as it is, on scrapy-redis ---------------------------------------------


@pytest.mark.slow
def test_project_runs_on_scrapy_redis(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """Sanity check of the reference: both spiders on scrapy-redis 0.9.1 (Scrapy 2.19
    no longer calls start_requests(), so scrapy-redis reads its start URLs at the first
    idle; and it closes only at the engine's 5 s idle heartbeat). Run side by side."""
    with ShopSite(SITE) as shop_site, ShopSite(SITE) as rules_site:
        push_srspider_entries(redis7_client, shop_site)
        redis7_client.lpush("srrules:seeds", rules_site.url + "/")
        workers = [
            start_project(PROJECT, name, redis7.url, tmp_path) for name in ("srspider", "srrules")
        ]
        shop, rules = (w.wait().ok() for w in workers)
        check_srspider_run(shop, shop_site)
        # scrapy-redis doesn't fingerprint start URLs (dont_filter): fetched again when linked
        assert max(shop_site.hits().values()) == 2
        assert rules_site.hits() == dict.fromkeys(rules_site.canonical_pages(), 1)
    assert shop.report["scrapy_redis_loaded"] and rules.report["scrapy_redis_loaded"]
    assert shop.stats["scheduler/enqueued/redis"] > 0
    assert rules.stats["item_scraped_count"] == SITE.products
    assert redis7_client.exists("srspider:dupefilter")  # SCHEDULER_PERSIST = True


# --- (b) the same project with only the class paths changed, on redcrawl -----------------


def test_migrated_redis_spider(
    migrated: Path, site: ShopSite, tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    push_srspider_entries(redis7_client, site)
    worker = start_project(migrated, "srspider", redis7.url, tmp_path)
    run = worker.wait().ok()

    assert not run.report["scrapy_redis_loaded"]  # really on redcrawl
    check_srspider_run(run, site)
    # as on scrapy-redis, start entries are always fetched (dont_filter), so the two start
    # pages are fetched again when linked; every other page once
    hits = site.hits()
    assert {p for p, n in hits.items() if n == 2} == {"/", "/category/2?page=1"}, hits
    assert set(hits) == site.canonical_pages() | set(BY_PRIORITY) and max(hits.values()) == 2
    total = SITE.pages + len(FANOUT) + 2  # the two start pages twice
    assert run.stats["redcrawl/acked"] == total
    # REDIS_URL: the crawl is in our Redis; the start entries were consumed
    assert redis7_client.llen("srspider:start_urls") == 0
    # SCHEDULER_PERSIST = True: the frontier outlives the worker
    assert crawl_keys(redis7_client, "srspider")
    c = frontier(redis7_client, "srspider", ordering="priority").counts()
    assert c.done == c.accepted == total and c.finished and c.conserved
    # MAX_IDLE_TIME_BEFORE_CLOSE = 2: the spider waited for more start URLs (a crawl of
    # 22 pages takes well under a second), then closed by itself
    assert run.report["closed_at"] - worker.launched_at >= 2


def test_migrated_redis_crawl_spider(
    migrated: Path, site: ShopSite, tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """RedisCrawlSpider: rules and LinkExtractor; start URLs from REDIS_START_URLS_KEY
    (``%(name)s:seeds``), the spider having no redis_key of its own."""
    redis7_client.lpush("srrules:seeds", site.url + "/")
    run = start_project(migrated, "srrules", redis7.url, tmp_path).wait().ok()

    assert not run.report["scrapy_redis_loaded"]
    assert site.hits() == dict.fromkeys(site.canonical_pages(), 1)
    assert run.stats["item_scraped_count"] == SITE.products
    assert redis7_client.llen("srrules:seeds") == 0
    c = frontier(redis7_client, "srrules", ordering="priority").counts()
    assert c.done == c.accepted == SITE.pages and c.finished and c.conserved


def test_max_idle_time_counts_from_the_end_of_the_crawl(
    migrated: Path, tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    config = SiteConfig(
        products=12, per_page=4, categories=2, tracking_params=False, slow_every=12, slow_delay=3
    )  # the crawl lasts > 3 s
    with ShopSite(config) as slow_site:
        redis7_client.lpush("srspider:start_urls", slow_site.url + "/")
        run = (
            start_project(migrated, "srspider", redis7.url, tmp_path, SRPROJ_MAX_IDLE="2")
            .wait()
            .ok()
        )
    last_response = max(t for _, _, t in run.report["responses"])
    assert run.report["closed_at"] - last_response >= 1.8
