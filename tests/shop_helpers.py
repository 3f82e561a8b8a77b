"""``redcrawl crawl`` of the demo shop site with 2 real Scrapy workers, checked the same way
wherever the crawl runs (tests/test_partitions.py with 4 partitions,
tests/test_cluster.py through a cluster URL)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from redcrawl.demo.run import SPIDER, demo_worker_settings
from redcrawl.demo.site import ShopSite, SiteConfig

__all__ = ["ShopCrawl", "crawl_the_shop"]

ROOT = Path(__file__).resolve().parent.parent
CRAWL = "shop"


@dataclass(frozen=True)
class ShopCrawl:
    """A finished crawl of the shop: its ``expected`` pages, the workers' ``logs``, and
    :meth:`cli` to run more ``redcrawl`` commands against it."""

    expected: set[str]
    logs: list[Path]
    env: dict[str, str]
    cwd: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """``redcrawl ARGS`` in the crawl's folder and environment."""
        return subprocess.run(
            [sys.executable, "-m", "redcrawl.cli", *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
        )


def crawl_the_shop(
    redis_url: str, tmp_path: Path, *, products: int, timeout: float, **env: str
) -> ShopCrawl:
    """Crawl a shop of ``products`` products (``env``: more REDCRAWL_* variables) with 2
    Scrapy workers: every page fetched exactly once, no traceback in a worker's log, and
    ``redcrawl status`` says the crawl is finished."""
    config = SiteConfig(products=products, per_page=20, categories=5, slow_every=7, slow_delay=0.05)
    sets: list[str] = []
    for item in [*demo_worker_settings(tmp_path / "items.db"), "CONCURRENT_REQUESTS=8"]:
        sets += ["--set", item]
    env = {
        **os.environ,
        "REDCRAWL_REDIS_URL": redis_url,
        "PYTHONPATH": str(ROOT / "src"),
        **env,
    }
    with ShopSite(config) as site:
        args = ["--workers", "2", "--crawl", CRAWL, "--no-progress", "--arg", f"url={site.url}"]
        run = subprocess.run(
            [sys.executable, "-m", "redcrawl.cli", "crawl", str(SPIDER), *args, *sets],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            timeout=timeout,
        )
        assert run.returncode == 0, run.stderr.decode()[-3000:]
        hits, expected = site.hits(), site.canonical_pages()
    assert set(hits) == expected
    assert max(hits.values()) == 1, "a page was fetched twice"
    logs = list((tmp_path / ".redcrawl" / "logs" / CRAWL).glob("w*.log"))
    for log in logs:
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    shop = ShopCrawl(expected, logs, env, tmp_path)
    status = shop.cli("status", "--crawl", CRAWL)
    assert status.returncode == 0 and b"finished" in status.stdout, status.stderr.decode()
    return shop
