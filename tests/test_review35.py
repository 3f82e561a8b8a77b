"""Review 35: defects found in the commits d4436b1..a971a48 (retries spaced for the fleet,
robots.txt pushing back, stop signals around the main command), each shown by a test that
fails on the code it was written against. Real redis-server, real Scrapy workers."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

from redcrawl.embedded import EmbeddedRedis
from redcrawl.frontier import open_frontier
from redcrawl.politeness.hosts import Hosts
from redcrawl.settings import Settings

from .conftest import RedisServer
from .test_trial12_messy_sites import DELAY, ROOT, TOLERANCE, Web, crawl_once, links

STOPS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


def _blocked(pid: int) -> set[int]:
    """The signals blocked in process ``pid`` (its SigBlk mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    raise AssertionError(f"no SigBlk for {pid}")


def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_the_embedded_redis_server_takes_sigterm(tmp_path: Path) -> None:
    """``EmbeddedRedis.start`` blocks SIGINT/SIGTERM/SIGHUP (``pthread_sigmask``) while it
    spawns the server and claims it (417f426), but a signal mask is inherited through
    fork and exec: the redis-server it starts has the three blocked for its whole life.
    ``kill PID`` (what redcrawl's own message advises: "Stop it (`kill {pid}`: it saves
    its data first)"), systemd's or Docker's stop, and the deleted-folder path of
    ``EmbeddedRedis.stop`` (``proc.terminate()``, then 10 s, then SIGKILL) never reach
    it: it runs on until SIGKILL, which skips its AOF flush."""
    server = EmbeddedRedis(tmp_path / ".redcrawl")
    server.start()
    proc = server.proc
    assert proc is not None
    try:
        blocked = _blocked(proc.pid) & set(STOPS)
        os.kill(proc.pid, signal.SIGTERM)
        gone = _exited(proc, 5.0)
        assert gone and not blocked, (
            f"redis-server pid {proc.pid} still runs 5 s after SIGTERM "
            f"(blocked in it: {sorted(signal.Signals(s).name for s in blocked)})"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()


def test_a_retry_whose_lease_was_taken_back_is_not_fetched(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """DOWNLOAD_DELAY=1. While ``/flaky``'s first fetch is on its way (it will answer
    500), the worker's leases are taken back, as the fleet does when its heartbeat is
    judged gone (``release_worker`` / ``expire_worker``: a worker frozen, or cut off from
    Redis, longer than REDCRAWL_LEASE_TTL): ``/flaky`` is READY again. The 500 reaches the
    worker; Scrapy retries it; ``retry_start`` answers -1, "not held under that token"
    (``PolitenessOps.retry_start``: None). ``Scheduler._retry_due`` takes that None as
    "start now" and hands the retry to Scrapy at once: the site gets ``/flaky`` again
    milliseconds after the 500, from a request the worker no longer holds (no slot, no
    spacing), and once more when the frontier grants it again. Every gap at the site must
    be a delay, and a request not held must not be fetched."""
    crawl = "review35-retry-not-held"
    web = Web(1)
    web.page(0, "/", links("/flaky"))
    web.page(0, "/flaky", (500, {}, "oops"), links())
    taken: list[int] = []

    def take_back(host: str, path: str) -> None:
        if path == "/flaky" and not taken:
            f = open_frontier(redis.Redis.from_url(redis7.url), Settings(), crawl)
            taken.append(sum(f.release_worker(w) for w in f.workers()))

    web.on_fetch = take_back
    with web.serving():
        crawl_once(redis7, crawl, [web.roots[0] + "/"], tmp_path)
    assert taken == [1], taken
    gaps = web.gaps(0)
    assert all(g >= DELAY - TOLERANCE for g, _, _ in gaps), gaps


def test_a_retry_waiting_for_an_operator_block_starts_when_the_block_is_lifted(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """An operator blocks a site for 20 s (``redcrawl hosts set KEY --block-for 20``)
    while one of its pages is being fetched; the page answers 500 and Scrapy retries it.
    ``retry_start`` reserves the retry's start at the block's end and the worker holds
    it in ``Scheduler._spacing`` with a ``callLater`` of the whole wait. 2 s later the
    operator lifts the block (``--block-until`` cleared): the site's other requests may
    be granted at once, but the retry is never asked about again and reaches the site
    only when the lifted block would have ended, 20 s after it was set (in flight all
    that time; the crawl cannot finish). A paused key's retry is given back (a971a48),
    and a late start of an operator-blocked key is refused, but an operator-blocked
    retry is held for the block's full length. It must come within a delay (plus the
    tolerance) of the block being lifted."""
    crawl = "review35-retry-blocked"
    web = Web(1)
    web.page(0, "/", links("/flaky"))
    web.page(0, "/flaky", (500, {}, "oops"), links())
    hosts: list[Hosts] = []
    lifted: list[float] = []

    def lift() -> None:
        hosts[0].set(web.hosts[0], block_until=None)
        lifted.append(time.monotonic())

    def block_at_the_500(host: str, path: str) -> None:
        if path == "/flaky" and not hosts:
            hosts.append(Hosts(open_frontier(redis.Redis.from_url(redis7.url), Settings(), crawl)))
            hosts[0].set(host, block_for=20)
            threading.Timer(2.0, lift).start()

    web.on_fetch = block_at_the_500
    with web.serving():
        crawl_once(redis7, crawl, [web.roots[0] + "/"], tmp_path)
    flaky = [t for t, path, _ in sorted(web.seen[web.hosts[0]]) if path == "/flaky"]
    assert len(flaky) == 2 and lifted, (flaky, lifted)
    late = flaky[1] - lifted[0]
    assert late <= DELAY + TOLERANCE, f"the retry came {late:.1f} s after the block was lifted"


CALLBACK_RETRY_SPIDER = '''
import scrapy
from scrapy.downloadermiddlewares.retry import get_retry_request


class CallbackRetrySpider(scrapy.Spider):
    """Follows every link; a page whose body says "again" is retried from the callback
    (Scrapy's documented get_retry_request, e.g. for a page that came back incomplete)."""

    name = "callback_retry"

    def __init__(self, urls: str = "", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = urls.split(",")

    def parse(self, response):
        if b"again" in response.body:
            retry = get_retry_request(response.request, spider=self, reason="incomplete page")
            if retry is not None:
                yield retry
            return
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href)
'''


def test_a_retry_from_a_callback_keeps_its_sites_concurrency(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """A site limited to one request at a time for the fleet (an operator's
    ``redcrawl hosts set KEY --concurrency 1``; the worker's own
    CONCURRENT_REQUESTS_PER_DOMAIN is 2, no delay). Its pages take 1.5 s to answer, but
    ``/flaky`` first answers at once with a page the spider's callback retries
    (``get_retry_request``, Scrapy's documented way). The retry copies the meta, so
    ``Scheduler._take_over`` gives it the original's lease, "its lease and its key's
    slot" (docs/politeness.md, "Scrapy's retries"), and ``retry_start`` spaces it; but
    that slot went back when the response arrived (``_on_response`` -> ``_free_slot``)
    and the frontier has granted the site's next page meanwhile: the site gets two
    requests at once. The fleet's concurrency must hold at the site."""
    crawl = "review35-callback-retry"
    spider = tmp_path / "callback_retry.py"
    spider.write_text(CALLBACK_RETRY_SPIDER)
    web = Web(1)
    web.page(0, "/", links("/flaky", "/p1", "/p2", "/p3"))
    web.page(0, "/flaky", (200, {}, "again"), links())
    for p in ("/p1", "/p2", "/p3"):
        web.page(0, p, links())
    state = {"in": 0, "most": 0, "flaky": 0}
    going: list[str] = []
    overlaps: list[list[str]] = []
    lock = threading.Lock()

    def slow(host: str, path: str) -> None:
        if path == "/":
            f = open_frontier(redis.Redis.from_url(redis7.url), Settings(), crawl)
            Hosts(f).set(host, concurrency=1)
            return
        with lock:
            if path == "/flaky":
                state["flaky"] += 1
                if state["flaky"] == 1:
                    return  # the quick answer that the callback retries
            state["in"] += 1
            state["most"] = max(state["most"], state["in"])
            going.append(path)
            if len(going) > 1:
                overlaps.append(list(going))
        time.sleep(1.5)
        with lock:
            state["in"] -= 1
            going.remove(path)

    web.on_fetch = slow
    with web.serving():
        crawl_once(
            redis7,
            crawl,
            [web.roots[0] + "/"],
            tmp_path,
            "CONCURRENT_REQUESTS_PER_DOMAIN=2",
            "DOWNLOAD_DELAY=0",
            spider=spider,
        )
    assert state["flaky"] == 2, state
    assert state["most"] == 1, f"at once at a site limited to 1: {overlaps}"


def test_a_start_waiting_for_the_folders_lock_still_takes_a_stop_signal(tmp_path: Path) -> None:
    """``EmbeddedRedis.start`` now blocks SIGINT/SIGTERM/SIGHUP for its whole ``with
    self._locked()`` block, and ``_locked`` waits for ``start.lock`` with a plain
    ``flock`` (no timeout). A process that holds that lock and does not let go (another
    redcrawl process stopped with Ctrl-Z, or hung, in the middle of its start or stop)
    leaves ``redcrawl crawl`` waiting with its stop signals blocked: Ctrl-C, SIGTERM and
    SIGHUP do nothing, only SIGKILL ends it (Trial 14's "never hangs"). Before 417f426 the
    signal ended the wait."""
    folder = tmp_path / ".redcrawl"
    folder.mkdir(mode=0o700)
    script = (
        "import sys; from pathlib import Path; from redcrawl.embedded import EmbeddedRedis; "
        "print('starting', flush=True); EmbeddedRedis(Path(sys.argv[1])).start()"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with open(folder / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (held by "another process")
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(folder)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"starting\n"
            time.sleep(1.0)  # (it waits in flock now)
            proc.send_signal(signal.SIGTERM)
            stopped = _exited(proc, 5.0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    assert stopped, "SIGTERM did not end a start waiting for the folder's lock within 5 s"


def test_a_retry_waiting_for_its_start_does_not_start_while_its_site_is_blocked(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """DOWNLOAD_DELAY=1, concurrency 2. ``/slow`` is granted first and takes 1.5 s to
    answer; ``/flaky``, granted a delay later, answers 500 at once, and its retry gets a
    start reserved a delay after that (``retry_start``). Before that start, ``/slow``
    answers ``429`` with ``Retry-After: 10``: the site is blocked for the fleet for 10 s
    (DeferMiddleware -> ``defer``). The retry, waiting in ``Scheduler._spacing`` on a
    ``callLater``, is never checked again and reaches the site half a second into the
    block. (docs/politeness.md leaves out only "a pause that comes while a retry already
    waits"; a site pushing back is the case Retry-After exists for.) Nothing may reach
    the site during the block."""
    retry_after = 10.0
    web = Web(1)
    web.page(0, "/", links("/slow", "/flaky"))
    web.page(0, "/slow", (429, {"Retry-After": f"{retry_after:.0f}"}, "slow down"), links())
    web.page(0, "/flaky", (500, {}, "oops"), links())
    answered: list[float] = []

    def slow(host: str, path: str) -> None:
        if path == "/slow" and not answered:
            time.sleep(1.5)
            answered.append(time.monotonic())

    web.on_fetch = slow
    with web.serving():
        crawl_once(redis7, "review35-retry-in-block", [web.roots[0] + "/"], tmp_path)
    with web.lock:
        seen = sorted(web.seen[web.hosts[0]])
    assert answered, seen
    during = [
        (round(t - answered[0], 2), path)
        for t, path, _ in seen
        if answered[0] < t < answered[0] + retry_after - TOLERANCE
    ]
    assert during == [], f"fetched while the site was blocked (s after the 429): {during}"
