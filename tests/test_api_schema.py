"""Schemathesis against the running API (real uvicorn, real Redis 7): valid and malformed
input generated from /openapi.json for every operation, with every check schemathesis has
(no 5xx, statuses and bodies as documented, schema-invalid input refused and schema-valid
input accepted, auth not ignored...), for each kind of caller: no token configured, a read
token, an admin token. A black-box run of the ``st`` command against ``redcrawl serve``
does the same with its coverage and stateful phases."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import redis
import schemathesis
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.generation import GenerationMode

from redcrawl.api import create_app
from redcrawl.settings import Settings

from .apikit import ADMIN, AUTH_ADMIN, AUTH_READ, READ, SRC, ApiServer, api_settings, serving
from .conftest import RedisServer, _free_port, need

MAX_EXAMPLES = 12
CRAWL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
KINDS = {"none": {}, "read": AUTH_READ, "admin": AUTH_ADMIN}
"""Callers: no token configured (an open API), a read token, an admin token."""
CALLS: dict[str, Counter[str]] = {kind: Counter() for kind in KINDS}
STATUSES: dict[str, Counter[int]] = {kind: Counter() for kind in KINDS}
load_all_checks()
ALL_CHECKS = [c for c in CHECKS.get_all() if callable(c) and not isinstance(c, type)]

pytestmark = pytest.mark.xdist_group("api_schema")
"""One pytest-xdist worker runs this whole module (but the black-box runs), in file order:
the last test counts the calls the schemathesis tests made in this process
(scripts/test.sh runs xdist with ``--dist loadgroup``)."""


@pytest.fixture(scope="module", params=list(KINDS))
def schema_server(
    request: pytest.FixtureRequest, redis7: RedisServer
) -> Iterator[tuple[str, ApiServer]]:
    kind = str(request.param)
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    settings = Settings(redis_url=redis7.url) if kind == "none" else api_settings(redis7.url)
    server = ApiServer(settings, client)
    # one crawl with a request, so that some generated calls find it
    import httpx

    httpx.post(
        f"{server.url}/v1/crawls/c/requests",
        headers=AUTH_ADMIN,
        timeout=10,
        json={"requests": [{"url": "https://example.com/"}]},
    ).raise_for_status()
    yield kind, server
    server.stop()
    client.close()


def _operations() -> list[tuple[str, str, bool]]:
    """(method, path, takes input) of every operation, from the app's schema (no server,
    no Redis). An operation without parameters or body can't be given malformed input."""
    spec = create_app(api_settings("redis://127.0.0.1:1")).openapi()
    return sorted(
        (m.upper(), p, bool(op.get("parameters") or op.get("requestBody")))
        for p, item in spec["paths"].items()
        for m, op in item.items()
    )


OPERATIONS = _operations()
CASES = [
    pytest.param(m, p, mode, id=f"{m} {p} {mode.value}")
    for m, p, takes_input in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if takes_input or mode == GenerationMode.POSITIVE
]


@pytest.fixture(scope="module")
def api_schema(schema_server: tuple[str, ApiServer]) -> Any:
    """The schema the running server publishes (security declared only with tokens)."""
    kind, server = schema_server
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    # the token as the configured auth (not a header forced onto every case): cases that
    # leave it out on purpose stay without it
    schema.config.update(headers=KINDS[kind] or None, base_url=server.url)
    return schema


# schemathesis's own pytest integration breaks on pytest 9.2 (it sets a private node
# attribute), so each operation's cases are drawn with plain hypothesis here.
@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_all_checks(
    method: str,
    path: str,
    mode: GenerationMode,
    api_schema: Any,
    schema_server: tuple[str, ApiServer],
) -> None:
    kind = schema_server[0]
    operation = api_schema[path][method]

    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.generate],
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        # A random valid crawl name would almost always be unknown (404 before any work):
        # aim valid names at the seeded crawl, keep invalid ones to test the rejection.
        params = case.path_parameters or {}
        if isinstance(params.get("crawl"), str) and CRAWL_NAME.match(params["crawl"]):
            params["crawl"] = "c"
        response = case.call(timeout=10)
        CALLS[kind][f"{method} {path}"] += 1
        STATUSES[kind][response.status_code] += 1
        case.validate_response(response, checks=ALL_CHECKS)

    check()


def test_every_operation_was_exercised(schema_server: tuple[str, ApiServer]) -> None:
    """Runs after the schemathesis test (file order): it really called every operation,
    with both accepted and rejected input."""
    import httpx

    kind, server = schema_server
    spec = httpx.get(f"{server.url}/openapi.json").json()
    operations = {
        f"{method.upper()} {path}" for path, item in spec["paths"].items() for method in item
    }
    assert len(operations) == 21 and operations == {f"{m} {p}" for m, p, _ in OPERATIONS}
    missing = operations - set(CALLS[kind])
    assert not missing, f"never called: {missing}; calls: {CALLS[kind]}"
    assert all(
        CALLS[kind][op] >= 5
        for op in operations
        if "health" not in op and "ready" not in op and "metrics" not in op
    ), CALLS[kind]
    statuses = STATUSES[kind]
    assert statuses[200] > 0 and statuses[422] > 0 and statuses[404] > 0, statuses
    assert (statuses[403] > 0) == (kind == "read"), statuses  # admin calls refused
    assert not [s for s in statuses if s >= 500], statuses
    assert ("bearer" in str(spec.get("components", {}).get("securitySchemes", {})).lower()) == (
        kind != "none"
    )


SUBMIT_REFUSED_ANYWAY = (
    '\n[[operations]]\ninclude-name = "POST /v1/crawls/{crawl}/requests"\n'
    "phases.coverage.enabled = false\n"
)
"""The read-token run leaves out one phase of one operation: the coverage phase of POST
.../requests, 27 of the 35 CPU-seconds of a run (schemathesis draws about 300 bodies whose
URLs match the URL pattern). With a read token every one of them is refused (403) by the
admin dependency before the body is validated, whatever the body; the admin run sends the
same bodies to the handler. The read run's examples, fuzzing and stateful phases still send
it bodies (refused), as does ``test_all_checks[read]`` (12 valid and 12 invalid)."""


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "kind",
    # (a group of its own each: these runs count nothing for the module's last test, and
    # at 30 s to 150 s each they are better spread over the xdist workers)
    [pytest.param(k, marks=pytest.mark.xdist_group(f"api_black_box_{k}")) for k in KINDS],
)
def test_black_box_run_reports_no_failures(kind: str, redis7: RedisServer, tmp_path: Path) -> None:
    """`st run --checks all` against a live `redcrawl serve`, as an outside audit runs it
    (examples, coverage, fuzzing and stateful phases; the read run without one
    operation's coverage phase: see SUBMIT_REFUSED_ANYWAY): 0 failures, 0 errors."""
    if shutil.which("st") is None:
        need("schemathesis's st command", "pip install schemathesis")
    redis.Redis.from_url(redis7.url).flushall()
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "REDCRAWL_REDIS_URL": redis7.url,
        "REDCRAWL_API_PORT": str(port),
    }
    for name in ("REDCRAWL_API_TOKENS", "REDCRAWL_API_ADMIN_TOKENS"):
        env.pop(name, None)
    if kind != "none":
        env.update(REDCRAWL_API_TOKENS=READ, REDCRAWL_API_ADMIN_TOKENS=ADMIN)
    auth = (
        []
        if kind == "none"
        else ["-H", f"Authorization: Bearer {ADMIN if kind == 'admin' else READ}"]
    )
    url = f"http://127.0.0.1:{port}"
    with serving(tmp_path, env, f"{url}/v1/health"):
        import httpx

        httpx.post(
            f"{url}/v1/crawls/c/requests",
            headers=AUTH_ADMIN if kind != "none" else {},
            json={"requests": [{"url": "https://example.com/"}]},
            timeout=10,
        ).raise_for_status()
        # 413 (a body over REDCRAWL_API_MAX_BODY, e.g. 1001 fat items) is a rejection too:
        # schemathesis's default list of rejection statuses leaves it out
        config = tmp_path / "schemathesis.toml"
        config.write_text(
            '[checks.negative_data_rejection]\nexpected-statuses = ["400", '
            '"401", "403", "404", "405", "406", "409", "413", "415", "422", '
            '"428", "429", "5xx"]\n' + (SUBMIT_REFUSED_ANYWAY if kind == "read" else "")
        )
        run = subprocess.run(
            [
                shutil.which("st") or "st",
                "--config-file",
                str(config),
                "run",
                f"{url}/openapi.json",
                *auth,
                "--checks",
                "all",
                "--max-examples",
                os.environ.get("ST_EXAMPLES", "5"),
                "--workers",
                "1",
                "--no-color",
                "--seed",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=540,
            cwd=tmp_path,
        )
    tail = run.stdout[-6000:]
    print(tail)
    assert run.returncode == 0, tail + run.stderr[-2000:]
    assert "Internal Server Error" not in run.stdout
