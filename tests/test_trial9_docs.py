"""Trial 9: the documentation walked through by a stranger, command by command. What the
docs promise and the tool does not; real processes (no mocks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


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
