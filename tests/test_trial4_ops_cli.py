"""Operator trial (session 4): `redcrawl exporter` and `redcrawl watch` given bad input, as a
stranger gives it. Real redis-server, real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import RedisServer


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


@pytest.mark.parametrize("url", ["notaurl", "ftp://example.com/hook", "http://"])
def test_watch_refuses_a_webhook_that_is_not_an_http_url(
    redis7: RedisServer, tmp_path: Path, url: str
) -> None:
    # before: accepted, exit 0 after its polls; the bad URL was only said (as a warning)
    # when an alert fired, that is when it mattered
    out = _run(
        ["watch", "--webhook", url, "--redis-url", redis7.url, "--interval", "0.1", "--polls", "1"],
        tmp_path,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "error: --webhook" in text
    assert repr(url) in text


def test_watch_says_what_it_watches_at_start(redis7: RedisServer, tmp_path: Path) -> None:
    # before: nothing at all was printed until an alert fired
    out = _run(
        [
            "watch",
            "--webhook",
            "http://127.0.0.1:9/hook",
            "--redis-url",
            redis7.url,
            "--interval",
            "0.1",
            "--polls",
            "1",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "watching every crawl" in out.stderr
    assert "http://127.0.0.1:9/..." in out.stderr  # the path may be a secret
