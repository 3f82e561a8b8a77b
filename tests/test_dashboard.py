"""The web dashboard at ``/`` of the API: plain httpx tests of access, escaping, CSRF and
404s, and a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by
Selenium) that loads the pages without console errors, sees a live crawl's counts, and
clicks requeue, pause and resume. ``REDCRAWL_SCREENSHOT=docs/dashboard.png`` also runs a
live fleet of Scrapy workers with fleet-wide politeness over the multi-site kit and saves
a screenshot of its crawl's page, hosts table included."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from redcrawl.codec import Envelope
from redcrawl.frontier import FrontierCore, open_frontier
from redcrawl.keys import HISTORY_MINUTES, CrawlKeys
from redcrawl.settings import Settings

from .apikit import ADMIN, AUTH_ADMIN, AUTH_READ, READ, ApiServer, api_settings
from .conftest import RedisServer, need, need_module

XSS = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"


def env(url: str) -> Envelope:
    return Envelope(url=url, fingerprint=hashlib.sha1(url.encode()).digest())


@pytest.fixture(scope="module")
def api_server(redis7: RedisServer) -> Iterator[ApiServer]:
    client = redis.Redis.from_url(redis7.url)
    server = ApiServer(api_settings(redis7.url), client)
    yield server
    server.stop()
    client.close()


@pytest.fixture
def frontier(api_server: ApiServer, redis7_client: redis.Redis) -> FrontierCore:
    """Crawl "shop" on a flushed Redis, as a worker sees it."""
    return open_frontier(redis7_client, api_server.settings, "shop")


def live_crawl(f: FrontierCore, *, dead_error: str = "HTTP 500") -> None:
    """12 pushed, 3 leased by w1 (one acked, one dead), 2 leased by w2: ready 7,
    in flight 3, done 1, dead 1."""
    f.push([env(f"https://shop.example/p{i}") for i in range(12)])
    a = f.lease("w1", 3)
    f.ack([a[0]])
    assert f.nack(a[1], dead_error, retry=False) == "dead"
    f.lease("w2", 2)
    c = f.counts()
    assert (c.ready, c.in_flight, c.done, c.dead) == (7, 3, 1, 1), c


def client(server: ApiServer, **kw: Any) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=10, **kw)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, html
    return found.group(1)


# --- access ------------------------------------------------------------------------------


def test_pages_need_a_token_and_login_sets_a_strict_httponly_cookie(
    api_server: ApiServer, frontier: FrontierCore
) -> None:
    live_crawl(frontier)
    with client(api_server) as c:
        r = c.get("/crawls/shop")
        assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fcrawls%2Fshop"
        assert c.get("/login").status_code == 200
        r = c.post("/login", data={"token": "nope", "next": "/"})
        assert r.status_code == 401 and "Unknown token" in r.text
        assert "set-cookie" not in r.headers
        r = c.post("/login", data={"token": READ, "next": "//evil.example/"})
        assert r.status_code == 303 and r.headers["location"] == "/"  # no open redirect
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
        r = c.get("/crawls/shop")
        assert r.status_code == 200 and 'id="count-ready">7<' in r.text
        assert "script-src" not in r.headers["content-security-policy"]  # no script at all
        assert "default-src 'none'" in r.headers["content-security-policy"]
        r = c.post("/logout")
        assert r.status_code == 303
        assert c.get("/").status_code == 303
    with client(api_server, headers=AUTH_READ) as c:  # a bearer header works too
        assert c.get("/").status_code == 200


def test_a_read_token_sees_no_buttons_and_cannot_act(
    api_server: ApiServer, frontier: FrontierCore
) -> None:
    live_crawl(frontier)
    with client(api_server, headers=AUTH_ADMIN) as admin:
        token = csrf_of(admin.get("/crawls/shop").text)
    with client(api_server, headers=AUTH_READ) as c:
        page = c.get("/crawls/shop").text
        assert "/requeue" not in page and "/pause" not in page and "csrf" not in page
        assert "Read-only" in page
        for action in ("requeue", "pause"):
            r = c.post(f"/crawls/shop/{action}", data={"csrf": token})
            assert r.status_code == 403, r.text
            assert "read-only" in r.text
    with client(api_server) as c:
        r = c.post("/crawls/shop/pause", data={"csrf": token})
        assert r.status_code == 401
    assert not frontier.is_paused() and frontier.counts().dead == 1


def test_actions_need_the_csrf_token_of_the_session(
    api_server: ApiServer, frontier: FrontierCore
) -> None:
    live_crawl(frontier)
    with client(api_server, headers=AUTH_ADMIN) as c:
        token = csrf_of(c.get("/crawls/shop").text)
        assert c.post("/crawls/shop/pause", data={}).status_code == 403
        assert c.post("/crawls/shop/pause", data={"csrf": "0" * 64}).status_code == 403
        assert not frontier.is_paused()
        r = c.post("/crawls/shop/pause", data={"csrf": token})
        assert r.status_code == 303 and frontier.is_paused()
        r = c.post("/crawls/shop/resume", data={"csrf": token}, follow_redirects=True)
        assert r.status_code == 200 and "resumed" in r.text and not frontier.is_paused()
        r = c.post("/crawls/shop/requeue", data={"csrf": token, "id": "not-an-id"})
        assert r.status_code == 422 and frontier.counts().dead == 1
        r = c.post("/crawls/shop/requeue", data={"csrf": token}, follow_redirects=True)
        assert "requeued 1" in r.text
        assert (frontier.counts().dead, frontier.counts().ready) == (0, 8)
    # a foreign Origin is refused by the Host/Origin guard before anything else
    with client(api_server, headers={**AUTH_ADMIN, "Origin": "http://evil.example"}) as c:
        assert c.post("/crawls/shop/pause", data={"csrf": token}).status_code == 403
    with client(api_server, headers={**AUTH_READ, "Host": "rebind.example"}) as c:
        assert c.get("/").status_code == 400  # DNS rebinding
    assert not frontier.is_paused()


def test_unknown_crawl_is_404(api_server: ApiServer, frontier: FrontierCore) -> None:
    with client(api_server, headers=AUTH_READ) as c:
        for path in ("/crawls/nothing-here", "/crawls/%3Cb%3Ex"):
            r = c.get(path)
            assert r.status_code == 404 and "does not exist" in r.text
            assert "<b>x" not in r.text
    with client(api_server, headers=AUTH_ADMIN) as c:
        token = csrf_of(_admin_page_with_a_crawl(c, frontier))
        assert c.post("/crawls/nothing-here/pause", data={"csrf": token}).status_code == 404


def test_refresh_period_is_kept_by_links_and_forms(
    api_server: ApiServer, frontier: FrontierCore
) -> None:
    live_crawl(frontier)
    with client(api_server, headers=AUTH_ADMIN) as c:
        assert 'http-equiv=refresh content="10"' in c.get("/").text
        page = c.get("/", params={"refresh": "0"}).text
        assert "http-equiv=refresh" not in page and 'href="/crawls/shop?refresh=0"' in page
        page = c.get("/crawls/shop", params={"refresh": "30"}).text
        assert 'content="30"' in page and 'action="/crawls/shop/pause?refresh=30"' in page
        r = c.post("/crawls/shop/pause?refresh=30", data={"csrf": csrf_of(page)})
        assert r.headers["location"] == "/crawls/shop?done=paused&refresh=30"


def test_wrong_method_names_the_allowed_one(api_server: ApiServer) -> None:
    with client(api_server, headers=AUTH_ADMIN) as c:
        r = c.get("/crawls/shop/pause")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        r = c.post("/")
        assert r.status_code == 405 and r.headers["allow"] == "GET"


def _admin_page_with_a_crawl(c: httpx.Client, frontier: FrontierCore) -> str:
    live_crawl(frontier)
    return c.get("/crawls/shop").text


def test_everything_from_redis_is_escaped(api_server: ApiServer, frontier: FrontierCore) -> None:
    frontier.push([env("https://shop.example/?q=<script>alert(1)</script>")])
    [lease] = frontier.lease("<b>worker</b>", 1)
    frontier.nack(lease, XSS, retry=False)
    with client(api_server, headers=AUTH_ADMIN) as c:
        page = c.get("/crawls/shop").text
        assert "<script" not in page and "<img" not in page and "<b>worker" not in page
        assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in page
        assert "&lt;b&gt;worker&lt;/b&gt;" in page
        assert "q=&lt;script&gt;alert(1)&lt;/script&gt;" in page
        r = c.get("/crawls/shop", params={"done": "<script>x</script>"})
        # (not even escaped: the banner shows only the actions' own words)
        assert "<script>x" not in r.text and "&lt;script&gt;x" not in r.text
        r = c.get("/login", params={"next": '/"><script>x</script>'})
        assert "<script>x" not in r.text


def test_history_is_one_sample_per_minute_capped(
    api_server: ApiServer, frontier: FrontierCore, redis7_client: redis.Redis
) -> None:
    live_crawl(frontier)
    key = CrawlKeys("shop").history
    sec, _ = redis7_client.time()
    minute = int(sec) // 60
    # an hour and a half of older samples: 10 done per minute
    redis7_client.zadd(
        key, {f"{m}:{(m - minute + 90) * 10}:0": m for m in range(minute - 90, minute)}
    )
    with client(api_server, headers=AUTH_READ) as c:
        for _ in range(3):
            page = c.get("/").text
    members: list[Any] = redis7_client.zrange(key, 0, -1, withscores=True)
    scores = [int(m[1]) for m in members]
    assert scores == sorted(set(scores))  # one per minute
    assert len(scores) <= HISTORY_MINUTES and scores[-1] == minute
    assert 0 < redis7_client.ttl(key) <= 2 * 3600
    assert "<svg" in page and "polyline" in page


def test_open_api_needs_no_login_but_still_a_session_csrf_streams_backend(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    settings = Settings(redis_url=redis7.url, retry_backoff=0.0, max_attempts=3, backend="streams")
    server = ApiServer(settings, redis7_client)
    try:
        f = open_frontier(redis7_client, settings, "shop")
        live_crawl(f)
        with client(server) as c:
            assert c.get("/login").status_code == 303
            first = c.get("/crawls/shop")
            assert 'id="count-inflight">3<' in first.text
            assert "redcrawl_session" in first.headers["set-cookie"]
            page = c.get("/crawls/shop")  # the same session: no new cookie
            assert page.status_code == 200 and "set-cookie" not in page.headers
            assert csrf_of(page.text) == csrf_of(first.text)
            token = csrf_of(page.text)
            assert c.post("/crawls/shop/pause", data={"csrf": token}).status_code == 303
            assert f.is_paused()
        with client(server) as other:  # another session: the token is not its own
            assert other.post("/crawls/shop/resume", data={"csrf": token}).status_code == 403
        assert f.is_paused()
    finally:
        server.stop()


# --- a real browser ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    webdriver = need_module("selenium.webdriver", "`pip install selenium` (the test extra)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if chromium is None or driver_bin is None:
        need("chromium and chromedriver", "`apt-get install chromium chromium-driver`")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--disable-extensions",
        "--no-first-run",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_bin), options=opts)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def login(driver: Any, server: ApiServer, token: str, path: str) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{server.url}{path}?refresh=0")
    assert "/login" in driver.current_url
    driver.find_element(By.ID, "token").send_keys(token)
    click(driver, By.ID, "login")
    assert driver.current_url == f"{server.url}{path}?refresh=0", driver.page_source


def click(driver: Any, by: str, what: str) -> None:
    """Click an element that loads a page, and wait until the new page is there (pages
    are asked with ``?refresh=0``: no reload of its own may come between)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.wait import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(by, what).click()
    WebDriverWait(driver, 10).until(ec.staleness_of(old))
    WebDriverWait(driver, 10).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )
    assert driver.find_elements(By.CSS_SELECTOR, "meta[http-equiv=refresh]") == []


def count(driver: Any, name: str) -> int:
    from selenium.webdriver.common.by import By

    return int(driver.find_element(By.ID, f"count-{name}").text.replace(",", ""))


def test_browser_shows_a_live_crawl_and_requeues_pauses_resumes(
    browser: Any, api_server: ApiServer, frontier: FrontierCore
) -> None:
    from selenium.webdriver.common.by import By

    live_crawl(frontier, dead_error=XSS)
    login(browser, api_server, ADMIN, "/")
    rows = browser.find_elements(By.CSS_SELECTOR, "#crawls tbody tr")
    assert [r.find_element(By.TAG_NAME, "a").text for r in rows] == ["shop"]
    cells = [td.text for td in rows[0].find_elements(By.TAG_NAME, "td")]
    assert cells[2:7] == ["7", "0", "3", "1", "1"], cells
    click(browser, By.CSS_SELECTOR, "#crawls tbody a")
    assert (
        count(browser, "ready"),
        count(browser, "inflight"),
        count(browser, "done"),
        count(browser, "dead"),
    ) == (7, 3, 1, 1)
    workers = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#workers tbody tr")]
    assert len(workers) == 2 and all(" s yes" in w for w in workers), workers
    err = browser.find_element(By.CSS_SELECTOR, "#dead td.err").text
    assert err == XSS and browser.title == "shop - redcrawl"  # shown as text, never run
    assert console_errors(browser) == []

    click(browser, By.CSS_SELECTOR, "#dead tbody button")
    assert browser.find_element(By.ID, "flash").text == "requeued 1"
    c = frontier.counts()
    assert (c.dead, c.ready) == (0, 8) and count(browser, "ready") == 8

    click(browser, By.ID, "btn-pause")
    assert frontier.is_paused() and browser.find_element(By.ID, "state").text == "paused"
    assert frontier.lease("w3", 5) == []
    click(browser, By.ID, "btn-resume")
    assert not frontier.is_paused() and browser.find_element(By.ID, "flash").text == "resumed"
    assert len(frontier.lease("w3", 2)) == 2
    assert console_errors(browser) == []


def test_browser_with_a_read_token_has_no_buttons(
    browser: Any, api_server: ApiServer, frontier: FrontierCore
) -> None:
    from selenium.webdriver.common.by import By

    live_crawl(frontier)
    login(browser, api_server, READ, "/crawls/shop")
    assert count(browser, "dead") == 1
    assert browser.find_elements(By.CSS_SELECTOR, "#dead button") == []
    assert browser.find_elements(By.ID, "btn-pause") == []
    assert console_errors(browser) == []


# --- the hosts table (crawls with politeness) ------------------------------------------


def polite_crawl(f: FrontierCore) -> None:
    """shop.example: 6 ready, 2 in flight (default concurrency 8); blocked.example
    blocked by the operator; a hostile download_slot with one request in flight."""
    from redcrawl.politeness.hosts import Hosts

    assert f.politeness == "host"
    f.push([env(f"https://shop.example/p{i}") for i in range(8)])
    f.push([env("https://blocked.example/")])
    u = "https://evil.example/"
    f.push(
        [
            Envelope(
                url=u, fingerprint=hashlib.sha1(u.encode()).digest(), meta={"download_slot": XSS}
            )
        ]
    )
    hosts = Hosts(f)
    hosts.set("blocked.example", block_for=600)
    hosts.set(XSS, delay=2.5)
    leased = f.lease("w1", 3)
    assert sorted(lease.envelope.url.split("/")[2] for lease in leased) == [
        "evil.example",
        "shop.example",
        "shop.example",
    ]


def test_hosts_table_escapes_keys_and_orders(api_server: ApiServer, frontier: FrontierCore) -> None:
    polite_crawl(frontier)
    with client(api_server, headers=AUTH_READ) as c:
        page = c.get("/crawls/shop").text
        assert "<h2>Hosts (top 3 of 3 by ready" in page
        assert "<script" not in page and "<img" not in page
        assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in page
        rows = re.findall(r"<tr><td class=key>(.*?)</td>", page)
        assert rows[0] == "shop.example" and len(rows) == 3, rows
        assert "blocked by operator until" in page
        page = c.get("/crawls/shop", params={"hosts": "inflight", "refresh": "0"}).text
        rows = re.findall(r"<tr><td class=key>(.*?)</td>", page)
        assert rows[:2] == ["shop.example", escape_html(XSS)], rows
        assert 'href="/crawls/shop?refresh=0&amp;hosts=ready"' in page


def escape_html(text: str) -> str:
    from html import escape

    return escape(text)


def test_no_hosts_table_without_politeness(redis7: RedisServer, redis7_client: redis.Redis) -> None:
    settings = Settings(redis_url=redis7.url, backend="streams", politeness=False)
    server = ApiServer(settings, redis7_client)
    try:
        live_crawl(open_frontier(redis7_client, settings, "shop"))
        with client(server) as c:
            page = c.get("/crawls/shop").text
            assert 'id="count-ready">7<' in page and "<h2>Hosts" not in page
    finally:
        server.stop()


def test_browser_shows_the_hosts_table(
    browser: Any, api_server: ApiServer, frontier: FrontierCore
) -> None:
    from selenium.webdriver.common.by import By

    polite_crawl(frontier)
    login(browser, api_server, READ, "/crawls/shop")
    rows = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in browser.find_elements(By.CSS_SELECTOR, "#hosts tbody tr")
    ]
    by_key = {r[0]: r[1:] for r in rows}
    assert set(by_key) == {"shop.example", "blocked.example", XSS}, rows
    assert by_key["shop.example"][:4] == ["6", "2", "0 s default", "8"], rows
    assert by_key["shop.example"][5] == "open"
    assert by_key["blocked.example"][4] != "" and by_key["blocked.example"][5].startswith(
        "blocked by operator until"
    )
    assert by_key[XSS][:4] == ["0", "1", "2.5 s override", "8"], rows
    assert browser.title == "shop - redcrawl"  # the key is text, never run
    click(browser, By.ID, "hosts-by-inflight")
    keys = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#hosts td.key")]
    assert keys[:2] == ["shop.example", XSS], keys
    assert console_errors(browser) == []


# --- the screenshot in docs/ (a live polite fleet) ----------------------------------------


@pytest.mark.slow
def test_browser_screenshot_of_a_live_polite_fleet(
    browser: Any,
    redis7: RedisServer,
    redis7_client: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3 Scrapy workers crawl 6 sites of the multi-site kit with fleet-wide politeness
    (DOWNLOAD_DELAY 0.5, 2 per site, robots.txt obeyed: one site asks for Crawl-delay 1
    and disallows a page, one answers 429 with Retry-After to a page, one is slow) while
    the dashboard is read in Chromium: the hosts table lists the sites with their limits
    and why each waits. Saves the screenshot to ``REDCRAWL_SCREENSHOT`` (skipped without
    it: it takes a minute of real crawling)."""
    from selenium.webdriver.common.by import By

    from .sitekit import Fault, SiteSpec, serving
    from .test_robots import robots_worker

    target = os.environ.get("REDCRAWL_SCREENSHOT")
    if not target:
        pytest.skip("set REDCRAWL_SCREENSHOT=docs/dashboard.png to take the screenshot")
    monkeypatch.delenv("REDCRAWL_SCREENSHOT")  # not a setting: the workers would refuse it
    redis7_client.flushall()
    crawl = "shop-fleet"
    sites = [
        SiteSpec(pages=60, delay=0.05, robots="User-agent: *\nCrawl-delay: 1\nDisallow: /p/1\n"),
        SiteSpec(pages=60, delay=0.05, faults={"/p/3": Fault(429, retry_after="20", times=1)}),
        SiteSpec(pages=60, delay=0.4),
        SiteSpec(pages=60, delay=0.05),
        SiteSpec(pages=60, delay=0.05),
        SiteSpec(pages=60, delay=0.05, faults={"/p/5": Fault(500)}),
    ]
    # the workers' lease ttl: the heartbeat ages are estimated with the reader's
    server = ApiServer(api_settings(redis7.url, lease_ttl=30.0), redis7_client)
    procs = []
    try:
        with serving(sites) as kit:
            for i in range(3):
                procs.append(
                    robots_worker(
                        redis7.url,
                        crawl,
                        kit.roots,
                        f"worker-{i + 1}",
                        tmp_path / f"w{i}.log",
                        [
                            "DOWNLOAD_DELAY=0.5",
                            "RANDOMIZE_DOWNLOAD_DELAY=False",
                            "CONCURRENT_REQUESTS_PER_DOMAIN=2",
                            "REDCRAWL_LEASE_TTL=30",
                            "RETRY_ENABLED=False",
                        ],
                    )
                )
            f = open_frontier(redis7_client, server.settings, crawl, follow_layout=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                c = f.counts()
                if c.done >= 60 and c.ready >= 20:
                    break
                time.sleep(0.5)
            login(browser, server, ADMIN, f"/crawls/{crawl}")
            time.sleep(3)  # a second look: the rates of the last seconds
            browser.set_window_size(1280, 1450)
            browser.get(f"{server.url}/crawls/{crawl}?refresh=0")
            keys = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#hosts td.key")]
            assert len(keys) >= 4 and set(keys) <= set(kit.hosts), keys
            assert count(browser, "done") >= 60
            assert console_errors(browser) == []
            Path(target).write_bytes(browser.get_screenshot_as_png())
    finally:
        browser.set_window_size(1280, 900)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        server.stop()
