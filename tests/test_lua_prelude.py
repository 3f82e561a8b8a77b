"""The shared prelude of the frontier scripts (frontier/lua/lib.lua, latency.lua, ops.lua):
literals that stand in for values computed at every call must equal what they replace."""

from __future__ import annotations

import re

from redcrawl import scripts
from redcrawl.metrics.buckets import LATENCY_BOUNDS_MS


def lua_table(src: str, name: str) -> list[str]:
    """The items of the Lua table constructor ``local <name> = {...}`` in ``src``."""
    m = re.search(r"local " + name + r" = \{([^}]*)\}", src)
    assert m, name
    return [x.strip().strip("'") for x in m.group(1).split(",")]


def test_latency_field_names_are_the_bounds() -> None:
    src = scripts.text("frontier/lua/latency.lua")
    bounds = [int(b) for b in lua_table(src, "LAT_BOUNDS")]
    assert tuple(bounds) == LATENCY_BOUNDS_MS
    assert lua_table(src, "LAT_FIELDS") == [f"lat:{b}" for b in bounds]
    assert f"local N_BOUNDS = {len(bounds)}" in src
