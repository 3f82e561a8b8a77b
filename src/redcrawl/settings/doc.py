"""The settings table as rows for ``docs/settings.md`` (``scripts/gen_settings_doc.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from redcrawl.settings.model import Settings
from redcrawl.settings.table import SPECS


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, Path | str):
        return str(value)
    return json.dumps(value)


SETTINGS_DOC: list[tuple[str, str, str, str]] = [
    (s.name, ", ".join(s.aliases), _show(getattr(Settings(), s.field)), s.doc) for s in SPECS
]
"""(name, scrapy-redis aliases, default, description) for every setting."""
