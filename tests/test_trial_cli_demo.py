"""An outside tester's finding on ``redcrawl demo``: a second demo in the same folder
purged the first one's crawl under its running workers (they stopped with "crawl 'demo'
vanished", its report said "finished yes" with 0 rows). Real demo processes, each with
its embedded Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from redcrawl.scrapy.pipelines import read_items


def demo(folder: Path, products: int) -> list[str]:
    return [
        sys.executable, "-m", "redcrawl", "demo", "--workers", "1", "--products",
        str(products), "--no-progress", "--dir", str(folder),
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_demo_in_the_same_folder_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "300", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent / "src")
    folder = tmp_path / "demo"
    first = subprocess.Popen(
        demo(folder, 300),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        assert first.stdout is not None
        for line in first.stdout:  # its crawl is under way once the dashboard is served
            if line.startswith("dashboard: "):
                break
        second = subprocess.run(
            demo(folder, 200), capture_output=True, text=True, cwd=tmp_path, env=env,
            timeout=120,
        )  # fmt: skip
        assert second.returncode == 2, second.stdout + second.stderr
        err = " ".join(second.stderr.split())
        assert err.startswith("error: another redcrawl demo (pid "), err
        assert f"(pid {first.pid})" in err and "another --dir" in err, err
        assert "Traceback" not in second.stderr
        rest, errors = first.communicate(timeout=240)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 0, rest[-3000:] + errors[-3000:]
    assert re.search(r"requests done\s*│\s*321\s", rest), rest
    assert len(read_items(f"sqlite:///{folder / 'items.db'}")) == 300

    # a finished demo does not block the next one
    third = subprocess.run(
        demo(folder, 40), capture_output=True, text=True, cwd=tmp_path, env=env, timeout=200
    )
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert len(read_items(f"sqlite:///{folder / 'items.db'}")) == 40
