"""The web dashboard while ``redcrawl demo`` runs: the control plane (``redcrawl serve``'s
app) on a free loopback port, in a thread of the demo's process, stopped with the demo."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from redcrawl.redis_server import free_port
from redcrawl.settings import Settings

__all__ = ["serving_dashboard"]

START_TIMEOUT = 10.0
"""Seconds the dashboard may take to start before the demo goes on without it."""


@contextmanager
def serving_dashboard(settings: Settings, client: redis.Redis) -> Iterator[str]:
    """Serve the dashboard on 127.0.0.1 and yield its address (the page of every crawl:
    the demo's crawl has a page of its own once its first requests are stored), or a
    sentence saying why there is none (the API extra is not installed, or it did not
    start). Without API tokens in the settings it is open, on loopback only, as
    ``redcrawl serve`` is."""
    try:
        import uvicorn

        from redcrawl.api.app import create_app
    except ImportError:
        yield "not served (pip install 'redcrawl[api]' to watch the crawl in a browser)"
        return
    port = free_port()
    app = create_app(settings.replace(api_host="127.0.0.1", api_port=port), client)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    # uvicorn installs signal handlers only on the main thread: Ctrl-C stays the demo's
    thread = threading.Thread(target=server.run, name="redcrawl-demo-dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        if server.started:
            yield f"http://127.0.0.1:{port}/"
        else:
            yield "not served (the dashboard did not start; see the log above)"
    finally:
        _stop(server, thread)


def _stop(server: Any, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(timeout=5)
