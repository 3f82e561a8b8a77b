"""Trial 8: redcrawl used as a stranger would on a real Redis Cluster (3 masters, 3
replicas), following only the user docs (README.md, docs/cluster.md, docs/cli.md,
docs/scrapy.md). Each test is a bug a user hit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from redcrawl.envelope import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import open_frontier
from redcrawl.redis_server import LocalCluster
from redcrawl.settings import Settings

from . import cluster
from .sitekit import SITEKIT_FILE, SiteSpec, serving
from .test_workers import cli_env

pytestmark = pytest.mark.cluster


@pytest.mark.slow
@pytest.mark.parametrize(("created", "worker"), [(16, 4), (1, 16), (16, 1)])
def test_crawl_refuses_another_partition_count_as_a_layout_change_with_exit_2(
    redis_cluster: LocalCluster,
    cluster_client: redis.Redis,
    tmp_path: Path,
    created: int,
    worker: int,
) -> None:
    """docs/cli.md, exit 2: "`crawl` with settings that change an existing crawl's layout
    (...): purge it or use a new `--crawl`", refused before any worker starts, as
    ``REDCRAWL_ORDERING=lifo`` or ``REDCRAWL_POLITENESS=off`` on an existing crawl are
    (``error: crawl X was created with other settings than these: ...``, exit 2). The
    partition count is such a layout setting (docs/cluster.md: "P is fixed at creation").
    Seen in trial 8: a crawl created with ``REDCRAWL_PARTITIONS=16`` run again with
    ``REDCRAWL_PARTITIONS=4`` (or 1; or a 1-partition crawl with 16) exits 1, the exit
    code of a failed worker, with ``error: crawl layout mismatch: ...``: the layout check
    of ``redcrawl crawl`` opens the frontier outside the ``try`` that turns a
    ``LayoutMismatch`` into exit 2, and a partitioned crawl's mismatch is raised by
    ``open_frontier`` itself."""
    crawl = f"t8-parts-{created}-{worker}"
    url = "http://127.0.0.2:1/"
    open_frontier(cluster_client, Settings(partitions=created), crawl).push(
        [Envelope(url=url, fingerprint=fingerprint(url))]
    )
    env = cli_env(redis_cluster.url) | {"REDCRAWL_PARTITIONS": str(worker)}
    with serving([SiteSpec(pages=2)]) as kit:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "redcrawl.cli",
                "crawl",
                str(SITEKIT_FILE),
                "--workers",
                "1",
                "--crawl",
                crawl,
                "--no-progress",
                "--arg",
                "urls=" + ",".join(kit.roots),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        fetched = sum(sum(kit.fetched(h).values()) for h in kit.hosts)
    out = " ".join((proc.stdout + proc.stderr).split())  # rich wraps long lines
    assert fetched == 0, out  # refused before any worker started
    assert f"crawl {crawl} was created with other settings than these" in out, out
    assert f"REDCRAWL_PARTITIONS={worker}" in out, out
    assert proc.returncode == 2, out


def test_status_prints_the_redis_cli_line_to_look_inside_the_cluster(
    redis_cluster: LocalCluster, cluster_client: redis.Redis, tmp_path: Path
) -> None:
    """docs/cluster.md, "Connecting": "`redcrawl status` prints a `redis-cli -c -u
    redis://...` line to look inside" (``redcrawl.connection.redis_cli_hint`` builds it:
    ``redis-cli`` takes no ``redis+cluster://`` URL, and needs ``-c`` to follow ``MOVED``).
    Seen in trial 8: status ends with ``Redis: redis+cluster://127.0.0.1:7301,...`` and no
    ``redis-cli`` line (the embedded Redis gets its ``redis-cli -s`` line; a cluster's
    hint is built by ``redis_cli_hint`` but nothing prints it)."""
    crawl = "t8-status-hint"
    url = "http://127.0.0.2:1/"
    open_frontier(cluster_client, Settings(), crawl).push(
        [Envelope(url=url, fingerprint=fingerprint(url))]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "redcrawl.cli", "status", "--crawl", crawl],
        cwd=tmp_path,
        env=cli_env(redis_cluster.url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    first = redis_cluster.url.removeprefix("redis+cluster://").split(",")[0]
    assert f"redis-cli -c -u redis://{first}" in out, out


@pytest.mark.slow
def test_a_tls_cluster_url_at_a_cluster_without_tls_names_the_fix(
    redis_cluster: LocalCluster, tmp_path: Path
) -> None:
    """docs/scrapy.md (a wrong setting at start): "`rediss://` against a server without
    TLS ... name[s] [its] fix", and docs/cluster.md: "TLS (`rediss+`) ... [is] that of a
    `redis://` URL". On one server ``redcrawl status --redis-url rediss://...`` says "The
    URL asks for TLS (rediss://): if the server does not use TLS, write redis:// instead".
    Seen in trial 8: ``rediss+cluster://`` at the (plain) cluster says only "Redis
    Cluster cannot be connected ... Timeout connecting to server. Check that the server is
    running", after about 32 s (the single-server refusal takes 6 s):
    ``redcrawl.cluster.connect_cluster`` raises ``RedisUnavailable`` without
    ``connection._tls_fix``, whose advice should then name ``redis+cluster://``."""
    first = redis_cluster.url.removeprefix("redis+cluster://").split(",")[0]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "redcrawl.cli",
            "status",
            "--crawl",
            "t8-tls",
            "--redis-url",
            f"rediss+cluster://{first}",
        ],
        cwd=tmp_path,
        env=cli_env(redis_cluster.url),
        capture_output=True,
        text=True,
        timeout=90,
    )
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 3, out
    assert "asks for TLS" in out, out
    assert "redis+cluster://" in out.split("asks for TLS", 1)[1], out


def test_a_mistyped_cluster_scheme_is_told_the_cluster_schemes(
    redis_cluster: LocalCluster, tmp_path: Path
) -> None:
    """A user of docs/cluster.md who types ``redis-cluster://`` (or ``cluster://``) for
    ``redis+cluster://``. Seen in trial 8: ``error: setting REDCRAWL_REDIS_URL:
    redis-cluster://...: Redis URL must specify one of the following schemes (redis://,
    rediss://, unix://)``, exit 2: redis-py's message, listing every scheme but the two
    for a cluster, as if redcrawl had no cluster support."""
    first = redis_cluster.url.removeprefix("redis+cluster://").split(",")[0]
    for scheme in ("redis-cluster", "cluster"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "redcrawl.cli",
                "status",
                "--crawl",
                "t8-scheme",
                "--redis-url",
                f"{scheme}://{first}",
            ],
            cwd=tmp_path,
            env=cli_env(redis_cluster.url),
            capture_output=True,
            text=True,
            timeout=60,
        )
        out = " ".join((proc.stdout + proc.stderr).split())
        assert proc.returncode == 2, out
        assert "redis+cluster://" in out.split(f"{scheme}://{first}", 1)[1], out


@pytest.mark.slow
def test_ctrl_c_reaches_the_workers_while_the_cluster_does_not_answer(tmp_path: Path) -> None:
    """docs/cli.md, "Redis outages": "The command's own reads (the progress line, whether
    to restart a worker) give up after 2 s and are tried again: while Redis is unreachable
    the progress line stops and one warning says so"; "Signals": Ctrl-C stops the workers
    cleanly, each gets SIGINT. On one server the supervisor reads through a client
    without retries and a 2 s timeout, so that "the loop that forwards signals must not
    sit in redis-py's ~30 s of retries" (``workers._Watch``).
    Seen in trial 8 on the cluster: with every node frozen (SIGSTOP, an outage without a
    failover), a Ctrl-C reached the workers only when the cluster answered again, 25 s
    later, and no "Redis unreachable" warning was said: the supervisor handles signals
    between its reads (``Fleet.run``), and its fail-fast client is a ``ClusterClient``,
    whose commands and pipelines wait out trouble for ``cluster.OUTAGE`` (30 s) whatever
    ``retry`` and ``socket_timeout`` it was given (one ``counts()`` of a frozen master
    took 36 s)."""
    crawl = "t8-sigint"
    with (
        cluster.start(tmp_path / "cluster") as local,
        serving([SiteSpec(pages=300, links=3, delay=0.2)]) as kit,
    ):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "redcrawl.cli",
                "crawl",
                str(SITEKIT_FILE),
                "--workers",
                "1",
                "--crawl",
                crawl,
                "--no-progress",
                "--set",
                "TELNETCONSOLE_ENABLED=False",
                "--arg",
                "urls=" + ",".join(kit.roots),
            ],
            cwd=tmp_path,
            env=cli_env(local.url),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log = tmp_path / ".redcrawl" / "logs" / crawl / "w0.log"
        frozen: list[int] = []
        try:
            deadline = time.monotonic() + 40
            while sum(kit.fetched(kit.hosts[0]).values()) < 10:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            frozen = [n.proc.pid for n in local.live() if n.proc is not None]
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(1.0)
            proc.send_signal(signal.SIGINT)
            deadline = time.monotonic() + 10  # docs: the reads give up after 2 s
            while "Received SIGINT" not in log.read_text(errors="replace"):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            reached = "Received SIGINT" in log.read_text(errors="replace")
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
            try:
                out, _ = proc.communicate(timeout=45)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
    said = " ".join(out.split())
    assert reached, "SIGINT not passed on to the worker within 10 s of Ctrl-C: " + said
