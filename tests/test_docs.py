"""Docs that are generated from code stay in step with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_settings_doc_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_settings_doc.py", "--check"], cwd=ROOT, check=False
    )
    assert result.returncode == 0, "docs/settings.md is stale: run scripts/gen_settings_doc.py"


def test_public_api() -> None:
    import redcrawl

    for name in redcrawl.__all__:
        assert hasattr(redcrawl, name), name
    assert (ROOT / "src" / "redcrawl" / "py.typed").exists()
