"""The ``redcrawl`` command: run workers, watch a crawl, seed it, inspect its dead letters.

A thin layer over the library: :mod:`redcrawl.workers` runs and supervises the worker
processes, the frontier does the rest. Every command works on one crawl (``--crawl``) in
one Redis (``--redis-url``, default: the embedded Redis in ``./.redcrawl``). Settings come
from the Scrapy project (when run inside one), then ``REDCRAWL_*`` environment variables,
then flags. Commands that only look at a crawl never start the embedded Redis on a folder
that holds no crawl. Exit codes (:class:`~redcrawl.workers.ExitCode`): 0 ok, 1 the crawl
or a worker failed, 2 bad usage or configuration, 3 Redis unreachable or no crawl state
found, 4 dead letters with ``crawl --fail-on-dead``, 128+N stopped by signal N (130
Ctrl-C, 143 SIGTERM, 129 SIGHUP). docs/cli.md describes every command.

The commands live by topic: :mod:`._common` (the app, options, error mapping and the rules
that pick the crawl and the Redis), :mod:`.run` (crawl, demo, serve, stop-embedded),
:mod:`.crawls` (status, crawls, seed, dead, pause, resume, purge), :mod:`.migrate`
(import-scrapy-redis, import-dupefilter, migrate), :mod:`.observe` (exporter, watch, top),
:mod:`.hosts` (hosts: see and steer politeness per key).
"""

from __future__ import annotations

# each module registers its commands (run's first: crawl, demo, serve lead --help)
from redcrawl.cli import run  # noqa: F401  # isort: skip
from redcrawl.cli import crawls, hosts, migrate, observe  # noqa: F401
from redcrawl.cli._common import app

__all__ = ["app", "main"]


def main() -> None:
    app()
