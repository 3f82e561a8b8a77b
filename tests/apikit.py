"""What the API tests share: tokens, settings, and the app served by a real uvicorn in a
thread (not fixtures: each test module builds what it needs from these)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import redis
import uvicorn

from redcrawl.api import create_app
from redcrawl.settings import Settings

from .conftest import _free_port

__all__ = [
    "ADMIN",
    "AUTH_ADMIN",
    "AUTH_READ",
    "MAX_BATCH",
    "READ",
    "SRC",
    "ApiServer",
    "api_settings",
    "serving",
]

READ = "read-token-of-the-tests-1"
ADMIN = "admin-token-of-the-tests-1"
AUTH_READ = {"Authorization": f"Bearer {READ}"}
AUTH_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
MAX_BATCH = 10
SRC = Path(__file__).resolve().parent.parent / "src"


class ApiServer:
    """The app served by a real uvicorn on a free loopback port, in a thread."""

    def __init__(
        self, settings: Settings, client: redis.Redis, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(settings, client, clock=clock),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def api_settings(url: str, **changes: Any) -> Settings:
    return Settings(
        redis_url=url,
        api_tokens=(READ,),
        api_admin_tokens=(ADMIN,),
        api_max_batch=MAX_BATCH,
        retry_backoff=0.0,
        max_attempts=3,
        **changes,
    )


def _wait_serving(
    proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 30
) -> httpx.Response:
    """The first answer of a ``redcrawl serve`` process at ``url``; fails with its log if
    it exits or does not answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)


@contextlib.contextmanager
def serving(
    cwd: Path, env: dict[str, str], health_url: str, *args: str, timeout: float = 30
) -> Iterator[tuple[httpx.Response, Path]]:
    """``redcrawl serve ARGS`` in its own process for the block: yields its first answer
    at ``health_url`` and its log file (still there after the block); terminated after."""
    log = cwd / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "redcrawl", "serve", *args],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield _wait_serving(proc, health_url, log, timeout), log
    finally:
        proc.terminate()
        proc.wait(10)
