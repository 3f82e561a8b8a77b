"""Trial 8: redcrawl used as a stranger would on a real Redis Cluster (3 masters, 3
replicas), following only the user docs (README.md, docs/cluster.md, docs/cli.md,
docs/scrapy.md). Each test is a bug a user hit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis

from redcrawl.envelope import Envelope
from redcrawl.fingerprint import fingerprint
from redcrawl.frontier import open_frontier
from redcrawl.redis_server import LocalCluster
from redcrawl.settings import Settings

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
