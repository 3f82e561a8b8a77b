"""The multi-site test server (tests/sitekit.py) records what the politeness tests rely on."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from .sitekit import Fault, MultiSite, SiteSpec, format_summary, serving

ROOT = Path(__file__).resolve().parent.parent
SITEKIT = Path(__file__).with_name("sitekit.py")


def get(url: str) -> tuple[int, dict[str, str], str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request("GET", parts.path or "/")
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def test_each_site_is_its_own_loopback_host() -> None:
    with serving(3) as kit:
        assert kit.hosts == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        for host, root in zip(kit.hosts, kit.roots, strict=True):
            assert urlsplit(root).hostname == host
            status, _, body = get(root)
            assert status == 200 and f"<h1>{host}/</h1>" in body
        assert [s.fetches for s in kit.summary()] == [1, 1, 1]


def test_pages_link_within_their_site_and_roots_across_sites() -> None:
    with serving([SiteSpec(pages=5, links=2), SiteSpec(pages=2, cross_links=False)]) as kit:
        _, _, root = get(kit.roots[0])
        for i in range(5):
            assert f'href="/p/{i}"' in root
        assert f'href="{kit.roots[1]}"' in root
        _, _, other = get(kit.roots[1])
        assert kit.roots[0] not in other
        _, _, page = get(kit.roots[0] + "p/4")
        assert 'href="/p/0"' in page and 'href="/p/1"' in page and 'href="/"' in page
        assert get(kit.roots[0] + "p/5")[0] == 404
        assert get(kit.roots[0] + "nope")[0] == 404
        assert kit.pages(kit.hosts[1]) == {"/", "/p/0", "/p/1"}


def test_in_progress_and_gaps_are_recorded_per_host() -> None:
    with serving([SiteSpec(delay=0.3), SiteSpec()]) as kit:
        slow, fast = kit.hosts
        threads = [threading.Thread(target=get, args=(kit.roots[0] + f"p/{i}",)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert kit.max_in_progress(slow) == 3
        gap = kit.min_gap(slow)
        assert gap is not None and gap < 0.1
        for i in range(3):
            get(kit.roots[1] + f"p/{i}")
            time.sleep(0.15)
        assert kit.max_in_progress(fast) == 1
        gap = kit.min_gap(fast)
        assert gap is not None and 0.14 <= gap < 0.5
        assert kit.min_gap("127.0.0.99") is None
        assert len(kit.starts(slow)) == 3 and kit.fetched(slow)["/p/0"] == 1
        assert "127.0.0.2" in format_summary(kit.summary())
        kit.reset()
        assert kit.max_in_progress(slow) == 0 and kit.starts(slow) == []


def test_faults_answer_their_status_then_recover() -> None:
    faults = {
        "/p/0": Fault(429, retry_after="3", times=2),
        "/p/1": Fault(503),
        "/p/2": Fault(429, times=1),
    }
    with serving([SiteSpec(faults=faults)]) as kit:
        root = kit.roots[0]
        first, second, third = get(root + "p/0"), get(root + "p/0"), get(root + "p/0")
        assert (first[0], first[1].get("Retry-After")) == (429, "3")
        assert second[0] == 429 and third[0] == 200
        assert [get(root + "p/1")[0] for _ in range(3)] == [503, 503, 503]
        assert "Retry-After" not in get(root + "p/1")[1]
        assert [get(root + "p/2")[0] for _ in range(2)] == [429, 200]
        # the server records a fetch's end after the client has read the answer: wait
        deadline = time.monotonic() + 5
        while any(f.end is None for f in kit.fetches(kit.hosts[0])) and time.monotonic() < deadline:
            time.sleep(0.01)
        log = kit.fetches(kit.hosts[0])
        assert [(f.path, f.status) for f in log[:3]] == [
            ("/p/0", 429),
            ("/p/0", 429),
            ("/p/0", 200),
        ]
        assert all(f.end is not None and f.end >= f.start for f in log)


def test_robots_txt_per_host_and_its_fetches_are_counted() -> None:
    robots = "User-agent: *\nCrawl-delay: 1\nDisallow: /p/1\n"
    with serving([SiteSpec(robots=robots), SiteSpec()]) as kit:
        a, b = kit.hosts
        assert get(kit.roots[0] + "robots.txt")[2] == robots
        get(kit.roots[0] + "robots.txt")
        assert get(kit.roots[1] + "robots.txt")[0] == 404
        assert (kit.robots_fetches(a), kit.robots_fetches(b)) == (2, 1)
        assert kit.starts(a, robots=False) == []


def test_too_many_sites_is_refused() -> None:
    with pytest.raises(ValueError, match="1 to 250"):
        MultiSite(0)


@pytest.mark.slow
def test_one_scrapy_worker_crawls_every_page_within_its_own_limits(tmp_path: Path) -> None:
    """The spider reaches every page of every site from one root, and one plain Scrapy
    process (in-memory scheduler) keeps the per-domain limit at each host and, nearly,
    DOWNLOAD_DELAY: what the fleet tests expect of the whole fleet.

    Nearly: Scrapy stamps a slot's delay when it takes a request off the slot's queue,
    and the request reaches the site when the reactor next writes; on 2 busy cores gaps
    at the site came down to 0.15 s for a 0.2 s delay (without the delay they are ~0)."""
    with serving([SiteSpec(pages=6, delay=0.25) for _ in range(3)]) as kit:
        cmd = [
            sys.executable,
            "-m",
            "scrapy",
            "runspider",
            str(SITEKIT),
            "-a",
            f"urls={kit.roots[0]}",
            "-s",
            "CONCURRENT_REQUESTS_PER_DOMAIN=2",
            "-s",
            "DOWNLOAD_DELAY=0.2",
            "-s",
            "RANDOMIZE_DOWNLOAD_DELAY=False",
            "-s",
            "LOG_LEVEL=WARNING",
            "-s",
            "TELNETCONSOLE_ENABLED=False",
            "-s",
            "ROBOTSTXT_OBEY=False",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        result = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
        )
        assert result.returncode == 0, result.stderr[-3000:]
        summary = kit.summary()
        for host in kit.hosts:
            assert set(kit.fetched(host)) == kit.pages(host), format_summary(summary)
            assert kit.max_in_progress(host) <= 2, format_summary(summary)
            gap = kit.min_gap(host)
            assert gap is not None and gap >= 0.12, format_summary(summary)
