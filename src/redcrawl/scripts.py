"""The one registry of redcrawl's Lua scripts.

Every script is a concatenation of ``.lua`` files shipped in the package (named by their
path under ``redcrawl/``, e.g. ``frontier/lua/lease.lua``): read from disk once per
process (:func:`source`), registered once per component with redis-py's
``register_script`` (which sends ``EVALSHA`` and reloads the script on ``NOSCRIPT``, in
pipelines too), and run through :meth:`Scripts.run`, inside the Redis error boundary
(:func:`redcrawl.transport.redis_errors`).

Who composes what:

- frontier scripts: ``lua/base.lua``, ``frontier/lua/lib.lua``, the dedupe prelude
  (``dedupe/lua/common.lua`` and ``dedupe/lua/<mode>.lua``), ``frontier/lua/polite.lua``
  (fleet-wide politeness, both backends), the backend's queue layer
  (``frontier/lua/queue_<backend>.lua``), ``frontier/lua/ops.lua``, then the script itself
  (see :mod:`redcrawl.frontier.core`);
- the standalone dedupe filter: ``lua/base.lua``, ``dedupe/lua/header.lua``, the dedupe
  prelude, ``dedupe/lua/filter.lua`` (see :mod:`redcrawl.dedupe`);
- single-file scripts (``frontier/lua/purge.lua``, ``frontier/lua/counts_streams.lua``);
- RedisSpider's start entries: ``lua/base.lua`` then ``lua/start_claim.lua``,
  ``lua/start_settle.lua`` or ``lua/start_recover.lua`` (see
  :mod:`redcrawl.scrapy.spiders`).

The crawl lock uses redis-py's own ``Lock`` scripts (:mod:`redcrawl.lock`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

import redis

from redcrawl.transport import redis_errors

__all__ = ["BASE", "Scripts", "by_sha", "exists", "source", "text"]

BASE = "lua/base.lua"
"""The first lines of every script (server clock, chunked bulk calls, error replies)."""


_BY_SHA: dict[str, str] = {}
"""The source of every script registered in this process, by SHA1."""


def by_sha(sha: str) -> str | None:
    """The source of a script registered in this process (:class:`Scripts`), by its SHA1:
    what a Redis Cluster pipeline loads on the masters that lack it (redis-py's cluster
    pipelines do not)."""
    return _BY_SHA.get(sha)


def _path(path: str) -> Any:
    node: Any = resources.files("redcrawl")
    for part in path.split("/"):
        node = node / part
    return node


@cache
def text(path: str) -> str:
    """The text of the package's Lua file ``path`` (relative to ``redcrawl/``)."""
    return str(_path(path).read_text(encoding="utf-8"))


@cache
def exists(path: str) -> bool:
    """Whether the package ships the Lua file ``path``."""
    return bool(_path(path).is_file())


@cache
def source(*paths: str) -> str:
    """One script: the files ``paths`` joined in order (each read once per process)."""
    return "\n".join(text(p) for p in paths)


class Scripts:
    """The named scripts one component runs on one client, each registered once.

    ``sources`` maps a script's name to the files it is made of (see :func:`source`).
    """

    def __init__(self, client: Any, sources: Mapping[str, Sequence[str]]) -> None:
        self.client = client
        self._scripts = {
            name: client.register_script(source(*paths)) for name, paths in sources.items()
        }
        for script in self._scripts.values():
            _BY_SHA[script.sha] = script.script

    def __getitem__(self, name: str) -> Any:
        """The registered ``redis.commands.core.Script`` (its ``sha`` for raw pipelines)."""
        return self._scripts[name]

    def run(
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        client: Any = None,
        what: str | None = None,
    ) -> Any:
        """Run script ``name`` (on ``client``, e.g. a pipeline, or this registry's client),
        with Redis errors converted for ``what`` (default: the script's name).

        redis-py answers ``NOSCRIPT`` by loading the script and calling it again; when the
        server still lacks it, the load went to another server than the call (a Redis
        Cluster client whose map a failover has just made out of date: seen as a worker
        stopped by "Redis refused disown: No matching script"), and the call is sent
        once more as ``EVAL``, with the script's text: it runs wherever the call lands,
        and that server keeps it for the next ``EVALSHA``. A call that got ``NOSCRIPT``
        did not run, so nothing runs twice."""
        script = self._scripts[name]
        target = client or self.client
        with redis_errors(what or name):
            try:
                return script(keys=list(keys), args=list(args), client=target)
            except redis.exceptions.NoScriptError:
                return target.eval(script.script, len(keys), *keys, *args)
