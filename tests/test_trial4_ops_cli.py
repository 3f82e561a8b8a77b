"""Operator trial (session 4): `redcrawl exporter` and `redcrawl watch` given bad input, as a
stranger gives it. Real redis-server, real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

from redcrawl.cli.observe import exporter_client
from redcrawl.codec import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import Counts, open_frontier
from redcrawl.frontier.final import write_final
from redcrawl.metrics.watch import webhook_site
from redcrawl.redis_server import RedisServer as Server
from redcrawl.redis_server import free_port
from redcrawl.settings import Settings

from .conftest import RedisServer

URL = "http://127.0.0.1:9/page"


def _run(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "redcrawl", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _watch_once(
    webhook: str, redis_url: str, cwd: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``redcrawl watch`` for one quick poll."""
    poll = ["--interval", "0.1", "--polls", "1"]
    return _run(["watch", "--webhook", webhook, "--redis-url", redis_url, *extra, *poll], cwd)


def test_exporter_on_a_port_in_use_is_an_error_line_exit_2(
    redis7: RedisServer, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _run(["exporter", "--redis-url", redis7.url, "--port", str(port)], tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text
    assert f"error: cannot listen on 127.0.0.1:{port}" in text
    assert "--port" in text


@pytest.mark.parametrize(
    "url",
    ["notaurl", "ftp://example.com/hook", "http://", "http://h:abc/x", "http://h:99999/x"],
)
def test_watch_refuses_a_webhook_that_is_not_an_http_url(
    redis7: RedisServer, tmp_path: Path, url: str
) -> None:
    # before: accepted, exit 0 after its polls; the bad URL was only said (as a warning)
    # when an alert fired, that is when it mattered
    out = _watch_once(url, redis7.url, tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "error: --webhook" in text and "Traceback" not in text
    assert repr(url) in text


def test_watch_says_what_it_watches_at_start(redis7: RedisServer, tmp_path: Path) -> None:
    # before: nothing at all was printed until an alert fired
    out = _watch_once("http://127.0.0.1:9/hook", redis7.url, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "watching every crawl" in out.stderr
    assert "http://127.0.0.1:9/..." in out.stderr  # the path may be a secret


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait_http(proc: subprocess.Popen[str], url: str) -> tuple[int, str]:
    """The first answer of ``url`` served by ``proc`` (tried up to 300 times)."""
    for _ in range(300):
        if proc.poll() is not None:
            pytest.fail(f"the process exited ({proc.returncode}): {proc.communicate()[0]}")
        try:
            return _get(url)
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"{url} did not answer after 300 tries")


def _serve(redis_url: str, api_port: int, cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    args = ["serve", "--redis-url", redis_url, "--port", str(api_port)]
    return subprocess.Popen(
        [sys.executable, "-m", "redcrawl", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(proc: subprocess.Popen[str], server: Server | None = None) -> str:
    """Interrupt ``proc`` and return its output; killed (and ``server`` stopped) whatever
    happens."""
    try:
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=30)[0]
    finally:
        try:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        finally:
            if server is not None:
                server.stop()


def test_serve_started_while_redis_is_down_refuses_an_evicting_server_once_it_is_up(
    tmp_path: Path,
) -> None:
    # the review of a5e82d2: started while Redis was down, serve skipped the eviction
    # policy check for its whole life (with Redis up at its start it exits 2)
    redis_port, api_port = free_port(), free_port()
    proc = _serve(f"redis://127.0.0.1:{redis_port}/0", api_port, tmp_path)
    base = f"http://127.0.0.1:{api_port}"
    server = None
    try:
        assert _wait_http(proc, f"{base}/v1/health")[0] == 200
        server = Server(
            port=redis_port, extra=["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]
        )
        for path in ("/v1/ready", "/v1/crawls", "/v1/ready"):
            status, body = _get(base + path)
            assert status == 503, (path, body)
            assert "maxmemory-policy is allkeys-lru" in json.loads(body)["detail"], body
    finally:
        _stop(proc, server)


@pytest.mark.parametrize("auth", ["", ":wrong@"])
def test_serve_with_a_refused_login_exits_3_at_start(tmp_path: Path, auth: str) -> None:
    # the review of a5e82d2: a missing or wrong password was taken as "Redis is down":
    # serve served 503 forever instead of saying it and exiting 3
    server = Server()
    try:
        with redis.Redis.from_url(server.url) as admin:
            admin.config_set("requirepass", "s3cret")
        url = f"redis://{auth}127.0.0.1:{server.port}/0"
        out = _run(["serve", "--redis-url", url, "--port", str(free_port())], tmp_path, 30)
    finally:
        server.stop()
    text = out.stdout + out.stderr
    assert out.returncode == 3, text
    assert "password" in text
    assert "serving anyway" not in text


def test_serve_starts_while_redis_is_down_and_is_ready_once_it_is_up(tmp_path: Path) -> None:
    # deploy/kubernetes/serve.yaml probes /v1/health (liveness) and /v1/ready (readiness):
    # an API started before its Redis must answer them, not exit. Before: `serve` exited 3
    # ("cannot reach Redis") when Redis was down at its start, a crash loop until it was up.
    redis_port, api_port = free_port(), free_port()
    proc = _serve(f"redis://127.0.0.1:{redis_port}/0", api_port, tmp_path)
    base = f"http://127.0.0.1:{api_port}"
    server = None
    try:
        status, _body = _wait_http(proc, f"{base}/v1/health")
        assert status == 200
        status, body = _get(f"{base}/v1/ready")
        assert status == 503, body
        assert "Redis" in json.loads(body)["detail"]
        server = Server(port=redis_port)
        status, body = _get(f"{base}/v1/ready")
        assert status == 200, body
        status, body = _get(f"{base}/v1/crawls")
        assert (status, json.loads(body)) == (200, {"crawls": []})
    finally:
        out = _stop(proc, server)
    assert "not reachable" in out, out


def test_watch_and_exporter_say_a_crawl_given_that_does_not_exist(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    # a typo in --crawl: before, watched / exported as zeros without a word
    s = Settings(redis_url=redis7.url)
    open_frontier(redis7_client, s, "shop").push([Envelope(url=URL, fingerprint=fingerprint(URL))])
    out = _watch_once("http://127.0.0.1:9/hook", redis7.url, tmp_path, "--crawl", "shpo")
    assert out.returncode == 0, out.stderr
    assert "warning: no crawl named 'shpo'" in out.stderr
    assert "crawls there: shop" in out.stderr
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "redcrawl",
            "exporter",
            "--redis-url",
            redis7.url,
            "--port",
            str(port),
            "--crawl",
            "shpo",
            "--crawl",
            "shop",
        ],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        status, _body = _wait_http(proc, f"http://127.0.0.1:{port}/metrics")
        assert status == 200
    finally:
        text = _stop(proc)
    assert proc.returncode == 0, text
    assert "warning: no crawl named 'shpo'" in text
    assert "'shop'" not in text.split("crawls there:")[0]  # the one that exists is not named


def test_exporter_port_out_of_range_is_a_usage_error(redis7: RedisServer, tmp_path: Path) -> None:
    # before: OverflowError traceback from bind(), exit 1
    out = _run(["exporter", "--redis-url", redis7.url, "--port", "70000"], tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text
    assert "--port" in text


def test_exporter_scrape_while_redis_is_down_answers_up_0_within_a_scrape_timeout(
    tmp_path: Path,
) -> None:
    # Prometheus gives a scrape 10 s by default (scrape_timeout); a scrape that takes
    # longer is lost, and redcrawl_up 0 with it. Before: the exporter's client retried as
    # a worker does (~36 s of backoff) before answering redcrawl_up 0.
    server = Server()
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "redcrawl",
            "exporter",
            "--redis-url",
            server.url,
            *("--port", str(port)),
        ],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        status, body = _wait_http(proc, url)
        assert status == 200 and "redcrawl_up 1.0" in body
        server.stop()
        status, body = _get(url)
        assert status == 200 and "redcrawl_up 0.0" in body
    finally:
        _stop(proc, server)


def test_the_exporter_client_gives_up_inside_a_scrape_timeout_even_on_a_hung_server() -> None:
    # the review of 907e645: its 5 s read timeout x 3 attempts made a scrape of a hung
    # Redis (SIGSTOP) take ~15 s, past Prometheus's default 10 s scrape_timeout. The
    # worst case is computed from the client's own settings (no clock in the test)
    client = exporter_client(Settings(redis_url="redis://127.0.0.1:9/0"))
    try:
        kwargs = client.connection_pool.connection_kwargs
        retry = client.get_retry()
        assert retry is not None
        attempts = 1 + retry._retries
        assert kwargs["socket_connect_timeout"] == 1
        assert kwargs["socket_timeout"] == 2
        backoff = sum(retry._backoff.compute(n) for n in range(1, attempts))
        hung = attempts * kwargs["socket_timeout"] + backoff
        worst = attempts * (kwargs["socket_timeout"] + kwargs["socket_connect_timeout"]) + backoff
        assert hung < 9 and worst < 9, (hung, worst)
    finally:
        client.close()


def test_purge_of_a_crawl_that_does_not_exist_is_an_error(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    # docs/cli.md: a crawl that does not exist is "error: no crawl named ...", exit 1, for
    # purge too (the API's DELETE answers 404). Before: "purged crawl shpo", exit 0: a typo
    # looked like a purge done
    s = Settings(redis_url=redis7.url)
    shop = open_frontier(redis7_client, s, "shop")
    shop.push([Envelope(url=URL, fingerprint=fingerprint(URL))])
    out = _run(["purge", "--yes", "--redis-url", redis7.url, "--crawl", "shpo"], tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "error: no crawl named 'shpo'" in text and "crawls there: shop" in text
    assert "purged" not in text
    assert shop.counts().accepted == 1
    out = _run(["purge", "--yes", "--redis-url", redis7.url, "--crawl", "shop"], tmp_path)
    assert out.returncode == 0 and "purged crawl shop" in out.stdout, out.stderr
    out = _run(["purge", "--yes", "--redis-url", redis7.url, "--crawl", "shop"], tmp_path)
    assert out.returncode == 1 and "no crawl named 'shop'" in out.stderr  # purged already
    # one whose last worker removed it (SCHEDULER_PERSIST off), leaving its final counts
    # for `redcrawl crawl`: gone too (a review found purge saying "purged" here)
    write_final(redis7_client, shop.keys, Counts(1, 0, 0, 0, 0, 1, 0), {})
    out = _run(["purge", "--yes", "--redis-url", redis7.url, "--crawl", "shop"], tmp_path)
    assert out.returncode == 1 and "no crawl named 'shop'" in out.stderr, out.stdout


def _crawl_keys(client: redis.Redis, name: str) -> list[bytes]:
    return [k for k in client.scan_iter(match=f"rc:{{{name}*", count=1000)]


def test_purge_removes_a_crawl_whose_stats_are_gone_but_queues_are_left(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    # the review of 66cb707: purge asked only the stats hash whether the crawl exists, so
    # leftover state without it was "no crawl named ...", exit 1, and nothing was deleted
    s = Settings(redis_url=redis7.url)
    shop = open_frontier(redis7_client, s, "shop")
    shop.push([Envelope(url=URL, fingerprint=fingerprint(URL))])
    redis7_client.delete(shop.keys.stats)
    assert _crawl_keys(redis7_client, "shop")
    out = _run(["purge", "--yes", "--redis-url", redis7.url, "--crawl", "shop"], tmp_path)
    assert out.returncode == 0 and "purged crawl shop" in out.stdout, out.stderr
    left = [k for k in _crawl_keys(redis7_client, "shop") if k != shop.keys.stats.encode()]
    assert left == []


def test_purge_removes_a_crawl_with_only_a_worker_registered(
    redis7: RedisServer, redis7_client: redis.Redis, tmp_path: Path
) -> None:
    # a worker that leased before anything was pushed: control, workers, calls only
    s = Settings(redis_url=redis7.url)
    shop = open_frontier(redis7_client, s, "shop")
    assert shop.lease("w1", 1) == []
    shop.renew("w1")
    assert redis7_client.exists(shop.keys.workers)
    out = _run(["purge", "--yes", "--redis-url", redis7.url, "--crawl", "shop"], tmp_path)
    assert out.returncode == 0 and "purged crawl shop" in out.stdout, out.stderr
    left = [k for k in _crawl_keys(redis7_client, "shop") if k != shop.keys.stats.encode()]
    assert left == []


@pytest.mark.parametrize(
    ("url", "site"),
    [
        ("https://u:SECRET@h.example/", "https://h.example/..."),
        ("https://h.example/?token=SECRET", "https://h.example/..."),
        ("https://h.example?token=SECRET#frag", "https://h.example/..."),
        ("https://u:SECRET@h.example:8443/hooks/SECRET?x=SECRET", "https://h.example:8443/..."),
        ("http://[::1]:9000/SECRET", "http://[::1]:9000/..."),
        ("http://[::1]/", "http://[::1]/..."),
    ],
)
def test_webhook_site_keeps_user_info_query_and_path_out_of_logs(url: str, site: str) -> None:
    # the review of 8caf2c0: with an empty path or "/", the URL was logged whole
    assert webhook_site(url) == site
    assert "SECRET" not in webhook_site(url)
