"""Trial 9: the documentation walked through by a stranger, command by command. What the
docs promise and the tool does not; real processes (no mocks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import redis

from .apikit import AUTH_ADMIN, ApiServer, api_settings
from .conftest import RedisServer


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
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


def test_demo_with_a_negative_products_count_is_a_usage_error_that_starts_nothing(
    tmp_path: Path,
) -> None:
    # docs/cli.md, "Exit codes": 2 is bad usage, as `demo -w 33` is (typer's range check,
    # before anything starts). Before: `demo --products -1` started the embedded Redis,
    # then died on SiteConfig's ValueError with a traceback, exit 1.
    where = tmp_path / "demo"
    out = _run(
        ["demo", "--products", "-1", "--workers", "1", "--no-progress", "--dir", str(where)],
        tmp_path,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text
    assert "--products" in text
    assert not where.exists(), "a refused demo made its folder (and started its Redis)"


def test_a_bad_header_value_is_one_error_named_by_its_field(redis7: RedisServer) -> None:
    # docs/api.md, "Errors": validation errors add `errors`, "one {loc, msg} per bad field".
    # Before: a header value with CR/LF gave three entries, two of them about union
    # branches the value was never meant for ("Input should be a valid array"), with
    # pydantic's internal type names in each loc
    # ("requests[0].headers.dict[constrained-str,union[...]].X.constrained-str").
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    server = ApiServer(api_settings(redis7.url), client)
    try:
        with httpx.Client(base_url=server.url, headers=AUTH_ADMIN, timeout=10) as api:
            item = {"url": "https://example.com/", "headers": {"X": "a\r\nInjected: 1"}}
            r = api.post("/v1/crawls/c/requests", json={"requests": [item]})
    finally:
        server.stop()
        client.close()
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert len(errors) == 1, errors
    assert errors[0]["loc"] == "requests[0].headers.X", errors
    assert "constrained-str" not in r.text and "valid array" not in r.text, r.text
