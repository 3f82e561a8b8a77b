"""A Redis URL given with ``--redis-url`` is called ``--redis-url`` in the error it gets
(trial 8: "setting REDCRAWL_REDIS_URL: ..." for a URL the user typed on the command line,
and "unset them" advice about variables that were not set); one from the environment
keeps the variable's name."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def redcrawl(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    clean.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "redcrawl", *args],
        cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(ROOT / "src"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("url", "code"), [("foo://x", 2), ("redis://127.0.0.1:1/0", 3)], ids=["scheme", "refused"]
)
def test_the_flag_is_named_not_the_variable(tmp_path: Path, url: str, code: int) -> None:
    got = redcrawl(tmp_path, "status", "--redis-url", url)
    assert got.returncode == code, got.stderr
    assert "--redis-url" in got.stderr
    assert "REDCRAWL_REDIS_URL" not in got.stderr and "unset them" not in got.stderr


@pytest.mark.parametrize(
    ("url", "code"), [("foo://x", 2), ("redis://127.0.0.1:1/0", 3)], ids=["scheme", "refused"]
)
def test_the_variable_is_named_when_it_was_set(tmp_path: Path, url: str, code: int) -> None:
    got = redcrawl(tmp_path, "status", REDCRAWL_REDIS_URL=url)
    assert got.returncode == code, got.stderr
    assert "REDCRAWL_REDIS_URL" in got.stderr and "--redis-url" not in got.stderr


@pytest.mark.cluster
def test_a_cluster_that_does_not_serve_every_slot(tmp_path: Path) -> None:
    """Every node answers but ``cluster_state`` is ``fail`` (a master's slots unassigned):
    exit 3 with what is wrong and the redis-cli command to look (trial 8: it said "check
    that the server is running", which it was)."""
    from redcrawl.redis_server import LocalCluster

    from .cluster import NODE_TIMEOUT
    from .conftest import redis_binary

    with LocalCluster(
        redis_binary("7"), tmp_path / "c", masters=3, replicas=0, node_timeout=NODE_TIMEOUT
    ) as local:
        victim = local.masters()[2].client()
        victim.execute_command("CLUSTER", "FLUSHSLOTS")
        deadline = time.monotonic() + 30
        while victim.cluster("INFO")["cluster_state"] != "fail":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        got = redcrawl(tmp_path, "status", "--redis-url", local.url)
    assert got.returncode == 3, got.stderr
    assert "does not serve every slot" in got.stderr
    assert "redis-cli -c -u redis://127.0.0.1:" in got.stderr and "cluster nodes" in got.stderr
    assert "Check that the server is running" not in got.stderr
