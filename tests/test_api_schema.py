"""Schemathesis against the running API (real uvicorn, real Redis 7): valid and malformed
input generated from /openapi.json for every operation; no response may be a 5xx."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import redis
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from redcrawl.api import create_app

from .conftest import RedisServer
from .test_api import AUTH_ADMIN, ApiServer, api_settings

MAX_EXAMPLES = 25
CRAWL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
CALLS: Counter[str] = Counter()
STATUSES: Counter[int] = Counter()


@pytest.fixture(scope="module")
def schema_server(redis7: RedisServer) -> Iterator[ApiServer]:
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    server = ApiServer(api_settings(redis7.url), client)
    # one crawl with a request, so that some generated calls find it
    import httpx

    httpx.post(f"{server.url}/v1/crawls/c/requests", headers=AUTH_ADMIN, timeout=10,
               json={"requests": [{"url": "https://example.com/"}]}).raise_for_status()
    yield server
    server.stop()
    client.close()


def _operations() -> list[tuple[str, str, bool]]:
    """(method, path, takes input) of every operation, from the app's schema (no server,
    no Redis). An operation without parameters or body can't be given malformed input."""
    spec = create_app(api_settings("redis://127.0.0.1:1")).openapi()
    return sorted((m.upper(), p, bool(op.get("parameters") or op.get("requestBody")))
                  for p, item in spec["paths"].items() for m, op in item.items())


OPERATIONS = _operations()
CASES = [pytest.param(m, p, mode, id=f"{m} {p} {mode.value}") for m, p, takes_input in OPERATIONS
         for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
         if takes_input or mode == GenerationMode.POSITIVE]


@pytest.fixture(scope="module")
def api_schema(schema_server: ApiServer) -> Any:
    """The schema the running server publishes."""
    return schemathesis.openapi.from_url(f"{schema_server.url}/openapi.json")


# schemathesis's own pytest integration breaks on pytest 9.2 (it sets a private node
# attribute), so each operation's cases are drawn with plain hypothesis here.
@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_no_server_errors(method: str, path: str, mode: GenerationMode, api_schema: Any,
                          schema_server: ApiServer) -> None:
    operation = api_schema[path][method]

    @hypothesis.settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck),
                         phases=[hypothesis.Phase.generate])
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        # A random valid crawl name would almost always be unknown (404 before any work):
        # aim valid names at the seeded crawl, keep invalid ones to test the rejection.
        params = case.path_parameters or {}
        if isinstance(params.get("crawl"), str) and CRAWL_NAME.match(params["crawl"]):
            params["crawl"] = "c"
        response = case.call(base_url=schema_server.url, headers=AUTH_ADMIN, timeout=10)
        CALLS[f"{method} {path}"] += 1
        STATUSES[response.status_code] += 1
        case.validate_response(response, checks=[not_a_server_error])

    check()


def test_every_operation_was_exercised(schema_server: ApiServer) -> None:
    """Runs after the schemathesis test (file order): it really called every operation,
    with both accepted and rejected input."""
    import httpx

    spec = httpx.get(f"{schema_server.url}/openapi.json").json()
    operations = {f"{method.upper()} {path}" for path, item in spec["paths"].items()
                  for method in item}
    assert len(operations) == 16 and operations == {f"{m} {p}" for m, p, _ in OPERATIONS}
    missing = operations - set(CALLS)
    assert not missing, f"never called: {missing}; calls: {CALLS}"
    assert all(CALLS[op] >= 5 for op in operations if "health" not in op
               and "ready" not in op), CALLS
    assert STATUSES[200] > 0 and STATUSES[422] > 0 and STATUSES[404] > 0, STATUSES
    assert not [s for s in STATUSES if s >= 500], STATUSES

