"""Security review (h-sec): each test shows one weakness found by trying redcrawl as an
attacker or a misconfiguring operator would, and fails until it is fixed. Real
redis-server processes (the ``redis7`` fixture, the embedded server), the real app served
by uvicorn, the real CLI in its own process; no mocks."""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import redis
import scrapy

from redcrawl import codec
from redcrawl.embedded import EmbeddedRedis
from redcrawl.errors import ConfigError, RedcrawlError
from redcrawl.frontier import open_frontier
from redcrawl.seed import seed
from redcrawl.settings import Settings

from .apikit import AUTH_ADMIN, AUTH_READ, SRC, ApiServer, api_settings
from .conftest import RedisServer, _free_port

# --- 1. a Redis password with '/', '#' or '?' is printed in full ------------------------

SECRET_A, SECRET_B = "PWHEADx7", "PWTAILq9"


def _redcrawl(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    clean.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "redcrawl", *args],
        cwd=cwd,
        env={**clean, "PYTHONPATH": str(SRC), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("sep", ["/", "#", "?"], ids=["slash", "hash", "question"])
def test_a_password_with_url_special_characters_is_never_printed(
    tmp_path: Path, redis7: RedisServer, sep: str
) -> None:
    """Generated passwords often hold '/' (``openssl rand -base64``), '#' or '?'. Written
    into REDCRAWL_REDIS_URL unencoded, :func:`redcrawl.connection.redact` no longer finds
    the password (``urlsplit`` ends the netloc at that character) and the whole URL, the
    password with it, is printed on stderr (and in every log that collects it):

        error: setting REDCRAWL_REDIS_URL: redis://:PWHEADx7/PWTAILq9@127.0.0.1:P/0:
        its path '/PWTAILq9@127.0.0.1:P/0' is not a database number; ...

    The URL is refused (right), but its password must not be shown."""
    url = f"redis://:{SECRET_A}{sep}{SECRET_B}@127.0.0.1:{redis7.port}/0"
    got = _redcrawl(tmp_path, "status", REDCRAWL_REDIS_URL=url)
    assert got.returncode != 0, got.stdout
    out = got.stdout + got.stderr
    assert SECRET_A not in out and SECRET_B not in out, out


# --- 2. the embedded Redis's data is readable by every user of the machine --------------


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)  # the usual default; the test must not depend on the runner's
    try:
        yield
    finally:
        os.umask(old)


def test_embedded_redis_data_is_private_to_its_user(tmp_path: Path, umask_022: None) -> None:
    """The embedded server's socket is mode 700 (only its user may connect), but its
    folder is created 755 and its append-only file 644: any other user of the machine
    reads every crawl's requests from the AOF (URLs with their query tokens, submitted
    headers such as Authorization or Cookie, meta). ``ls -la .redcrawl`` after
    ``redcrawl seed 'https://example.com/?token=SECRET'``:

        drwxr-xr-x .redcrawl
        -rw-r--r-- .redcrawl/appendonly.aof   (holds 'token=SECRET')
    """
    server = EmbeddedRedis(tmp_path / ".redcrawl")
    try:
        client = redis.Redis.from_url(server.start())
        client.hset("rc:{c}:req", "x", "https://example.com/?token=SECRET")
        client.close()
    finally:
        server.stop()
    folder = tmp_path / ".redcrawl"
    exposed = {
        str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in [folder, *folder.rglob("*")]
        if stat.S_IMODE(p.stat().st_mode) & 0o077
    }
    aof = [p for p in folder.rglob("*.aof*") if p.is_file()]
    assert aof, "no append-only file written"
    assert any(b"token=SECRET" in p.read_bytes() for p in aof)
    # the folder closed to others is enough; group/other bits on files inside it are moot
    assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, exposed


def test_embedded_socket_of_a_long_folder_is_not_in_a_shared_directory(tmp_path: Path) -> None:
    """A data folder whose socket path would be over 100 bytes puts the socket at
    ``/tmp/redcrawl-<sha1(folder)[:16]>.sock``: a name any local user can compute and take
    first (``/tmp`` is world-writable). ``EmbeddedRedis._alive`` then pings whatever
    answers there and uses it, so another user's redis-server receives the crawl (its
    URLs, headers, meta) and can feed it requests; a plain file there makes the start
    fail (``/tmp`` is sticky: it cannot be removed). The socket belongs in a directory
    only its user can write (e.g. a 0700 per-user directory, checked to be owned by us)."""
    deep = tmp_path / ("d" * 60) / ("e" * 60) / ".redcrawl"
    server = EmbeddedRedis(deep)
    parent = server.socket.parent
    mode = stat.S_IMODE(parent.stat().st_mode) if parent.exists() else 0
    assert not mode & 0o022, f"socket {server.socket} in {parent} (mode {oct(mode)})"


# --- 3. a key prefix with glob characters: purge deletes another prefix's keys ----------


def _push(client: redis.Redis, url: str, prefix: str, crawl: str) -> object:
    settings = Settings(redis_url=url, key_prefix=prefix)
    frontier = open_frontier(client, settings, crawl)
    frontier.push([codec.Envelope(url="https://example.com/", fingerprint=b"\x01" * 20)])
    return frontier


def test_purge_under_a_glob_prefix_spares_other_prefixes(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """REDCRAWL_KEY_PREFIX refuses only braces. Two teams share a Redis with prefixes
    ``tx`` and ``t?``; purging crawl ``a`` under ``t?`` SCANs ``t?:{a}:pq:*`` and
    ``t?:{a}:pol:*`` (:meth:`CrawlKeys.pol_patterns`) and UNLINKs what matches, which
    includes ``tx:{a}:pq:1:example.com`` and ``tx:{a}:pol:example.com``: the other team's
    crawl keeps ``ready=1`` with its queue gone (its request is never served again).
    Either refuse glob characters (``*?[]\\``) in the prefix, or escape it in patterns."""
    other = _push(redis7_client, redis7.url, "tx", "a")
    before = sorted(redis7_client.keys("tx:*"))
    try:
        mine = _push(redis7_client, redis7.url, "t?", "a")
    except ConfigError:
        return  # the prefix is refused: fixed that way
    mine.purge()  # type: ignore[attr-defined]
    assert sorted(redis7_client.keys("tx:*")) == before
    assert other.counts().ready == 1  # type: ignore[attr-defined]


# --- 4. a crawl name with a trailing newline passes validation ---------------------------


def test_a_crawl_name_with_a_trailing_newline_is_refused(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    r"""``CRAWL_NAME_PATTERN`` ends in ``$``, and Python's ``re.match`` lets ``$`` match
    before a final newline: ``validate_crawl_name("a\n")`` returns it. ``redcrawl seed
    --crawl $'a\n'`` (or REDCRAWL_CRAWL from a file with its newline) creates keys
    ``rc:{a\n}:...``: a crawl the API lists but cannot address (its path pattern, checked
    by pydantic's regex engine, refuses the name: GET/DELETE answer 422), whose name puts
    a line break in logs and in the CLI's output. Use ``re.fullmatch`` (or ``\Z``)."""
    settings = Settings(redis_url=redis7.url)
    with contextlib.suppress(ConfigError, RedcrawlError):
        seed(["https://example.com/"], settings=settings, crawl="a\n", client=redis7_client)
    created = [k for k in redis7_client.keys("*") if b"\n" in k]
    assert created == [], created


# --- 5. the unauthenticated readiness probe tells where Redis is and as whom -------------


@pytest.fixture
def api_without_redis(redis7: RedisServer) -> Iterator[ApiServer]:
    """The API with tokens, its Redis (ACL user ``crawler-svc``) not answering."""
    url = f"redis://crawler-svc:{SECRET_A}@127.0.0.1:{_free_port()}/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=1, retry_on_timeout=False)
    server = ApiServer(api_settings(url), client)
    try:
        yield server
    finally:
        server.stop()
        client.close()


def test_anonymous_readiness_probe_does_not_describe_the_redis(
    api_without_redis: ApiServer,
) -> None:
    """``/v1/ready`` needs no token (probes), so with Redis down anyone who reaches the
    API (bound beyond loopback once tokens are set) reads the Redis URL, password
    redacted: its address, port and ACL user name, and redis-py's error text:

        503 {"detail":"Redis (redis://crawler-svc:***@127.0.0.1:P/0) is unavailable:
        ..."}

    A probe needs the status only; the details belong to callers with a token (and the
    server's log)."""
    got = httpx.get(f"{api_without_redis.url}/v1/ready", timeout=30)
    assert got.status_code == 503, got.text
    port = api_without_redis.settings.redis_url.rsplit(":", 1)[1].split("/")[0]  # type: ignore[union-attr]
    assert "crawler-svc" not in got.text and port not in got.text, got.text


# --- 6. /login reads a whole unauthenticated body, up to REDCRAWL_API_MAX_BODY ------------


@pytest.fixture
def token_api(redis7: RedisServer, redis7_client: redis.Redis) -> Iterator[ApiServer]:
    server = ApiServer(api_settings(redis7.url), redis7_client)
    try:
        yield server
    finally:
        server.stop()


def test_login_does_not_wait_for_a_huge_unauthenticated_body(token_api: ApiServer) -> None:
    """Every API call checks the token before reading a body ("an unauthenticated call
    costs no body read at all", api/limits.py), and the dashboard's actions too. ``POST
    /login`` has no token yet by nature, and ``await request.body()`` reads the whole
    body, up to REDCRAWL_API_MAX_BODY (16 MiB), to keep its first MAX_FORM (4 KiB): each
    anonymous connection holds 16 MiB of the API's memory, and a slow one a worker of the
    event loop's reads for as long as it likes. A login form is never over MAX_FORM: a
    declared Content-Length over it can be answered (413) at once, and a streamed body
    refused once past it."""
    port = int(token_api.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.sendall(
            f"POST /login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {15 * 1024 * 1024}\r\n\r\n".encode()
        )
        sock.sendall(b"token=x&next=/&pad=" + b"a" * 65536)
        head = b""
        with contextlib.suppress(TimeoutError):
            while b"\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                head += chunk
        # before a fix: nothing (the server waits for the other 15 MiB), a recv timeout
        assert head.startswith(b"HTTP/1.1 4"), head[:200]
    finally:
        sock.close()


# --- 7. the exporter listens beyond loopback without a word -----------------------------


def test_exporter_warns_when_it_listens_beyond_loopback(
    tmp_path: Path, redis7: RedisServer
) -> None:
    """``redcrawl serve`` refuses a non-loopback address without tokens; ``redcrawl
    exporter --host 0.0.0.0`` (no authentication at all) starts silently and serves every
    crawl's name, worker ids and the Redis server's memory and persistence state to
    anyone who reaches the port. Its help says to bind it where only Prometheus reaches
    it; at least a ``warning:`` line when the address is not a loopback one."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REDCRAWL_")}
    log = tmp_path / "exporter.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "redcrawl", "exporter", "--host", "0.0.0.0", "--port", "0"],
            cwd=tmp_path,
            env={**clean, "PYTHONPATH": str(SRC), "REDCRAWL_REDIS_URL": redis7.url},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while "serving metrics" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        text = log.read_text()
        assert "serving metrics on http://0.0.0.0:" in text, text
        assert "warning" in text.lower(), text
    finally:
        proc.terminate()
        proc.wait(10)


# --- 8. a 300-byte scrapy-redis entry makes import-scrapy-redis allocate gigabytes ------

_IMPORT_UNDER_A_MEMORY_CAP = """
import resource, sys
import redis
from redcrawl.frontier import open_frontier
from redcrawl.migrate import import_scrapy_redis
from redcrawl.settings import Settings
cap = 768 * 1024 * 1024  # far more than an import of a few entries needs
resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
client = redis.Redis.from_url(sys.argv[1])
frontier = open_frontier(client, Settings(redis_url=sys.argv[1]), "srspider")
r = import_scrapy_redis(client, frontier, "srspider")
print("read", r.queue_read, "refused", r.refused, "unstorable", r.unstorable)
"""


def test_a_reference_bomb_in_a_scrapy_redis_queue_is_refused(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """:class:`redcrawl.migrate.RequestUnpickler` refuses every class and function, so a
    hostile queue entry cannot run code; but pickle's memo lets an entry of 300 bytes
    name one list twice, 40 levels deep: ``meta = {"k": x}`` with ``x = [x', x']``...
    Unpickled instantly (shared references), then encoded (msgpack writes every
    reference out): 2^40 leaves. At depth 24 the import spends 2.8 s and 218 MB before
    the 8 MiB request limit refuses it; at 27, 12 s and a MemoryError under a 2 GiB
    cap; at 40 the process grows until the kernel's OOM killer stops it (or another
    process of the machine). ``redcrawl import-scrapy-redis`` is meant to read an
    untrusted queue safely ("refusing anything but plain Scrapy request dicts"): an entry
    whose data is larger expanded than the limit must be refused like the others (count
    the nodes while walking it, or refuse shared containers in the unpickler)."""
    x: list[object] = ["a" * 10]
    for _ in range(40):
        x = [x, x]
    bomb = pickle.dumps(
        {"url": "https://example.com/", "meta": {"k": x}, "headers": {}, "method": "GET"},
        protocol=4,
    )
    assert len(bomb) < 400
    redis7_client.zadd("srspider:requests", {bomb: 0})
    got = subprocess.run(
        [sys.executable, "-c", _IMPORT_UNDER_A_MEMORY_CAP, redis7.url],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr[-400:]
    assert "read 1 refused 1 unstorable 0" in got.stdout or (
        "read 1 refused 0 unstorable 1" in got.stdout
    ), got.stdout


# --- 9. a crawled page's link puts control characters into politeness keys -------------

HOSTILE_PAGE = (
    b'<a href="http://ev\x1bcil.example/x">reset the terminal (ESC c)</a>'
    b'<a href="http://a\x1b7b.example/y">save the cursor (ESC 7)</a>'
    b'<a href="https://ok.example/">fine</a>'
)


def _links_stored(client: redis.Redis, url: str) -> list[str]:
    """The page's links, as a worker stores them: Scrapy's LinkExtractor, then the
    scheduler's own steps (``enqueue_request``: ``codec.from_request``,
    ``encode_for_store``; the feeder pushes) into crawl ``c``."""
    from scrapy.http import HtmlResponse
    from scrapy.linkextractors import LinkExtractor

    from redcrawl.envelope import encode_for_store
    from redcrawl.fingerprint import request_fingerprint

    page = HtmlResponse("https://site.example/", body=HOSTILE_PAGE, encoding="utf-8")
    links = [link.url for link in LinkExtractor().extract_links(page)]
    envs = []
    for link in links:
        request = scrapy.Request(link)
        env = codec.from_request(request, None, fingerprint=request_fingerprint(request))
        encode_for_store(env)
        envs.append(env)
    open_frontier(client, Settings(redis_url=url), "c").push(envs)
    return links


def test_a_crawled_link_cannot_write_escape_sequences_to_the_operators_terminal(
    tmp_path: Path, redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """A page links to ``http://ev<ESC>cil.example/``: Scrapy keeps the ESC in the host,
    the scheduler stores the request, :func:`redcrawl.politeness.key.politeness_key`
    makes the host a key as it is, and ``redcrawl hosts`` (rich strips BEL, BS, CR but
    not ESC) writes it raw: ``ESC c`` resets the operator's terminal, other sequences
    move the cursor or rewrite what is shown (any site crawled can). ``cat -v``:

        | ev^[cil.example | 1 | 0 | now | ...
    """
    links = _links_stored(redis7_client, redis7.url)
    assert any("\x1b" in link for link in links), links  # Scrapy keeps it
    got = _redcrawl(tmp_path, "hosts", "--crawl", "c", REDCRAWL_REDIS_URL=redis7.url)
    assert got.returncode == 0, got.stderr
    assert "ok.example" in got.stdout
    assert "\x1b" not in got.stdout + got.stderr, repr(got.stdout)


def test_every_politeness_key_listed_can_be_paused_by_the_operator(
    redis7: RedisServer, redis7_client: redis.Redis
) -> None:
    """The keys of those links are listed by ``GET /v1/crawls/c/hosts``, but ``PUT
    .../hosts/{key}`` (and ``redcrawl hosts block``) refuse them: 404 "it has control
    characters; no politeness key has any" (``check_key``), which is not so: a hostile
    site's hosts are the ones an operator cannot pause, block or slow down. Keys should
    never hold control characters (normalise them in ``politeness_key``), or the
    operator's calls accept every key that exists."""
    _links_stored(redis7_client, redis7.url)
    server = ApiServer(api_settings(redis7.url), redis7_client)
    try:
        listed = httpx.get(f"{server.url}/v1/crawls/c/hosts", headers=AUTH_READ, timeout=30).json()[
            "hosts"
        ]
        keys = [h["key"] for h in listed]
        assert len(keys) == 3, keys
        answers = {
            key: httpx.put(
                f"{server.url}/v1/crawls/c/hosts/{quote(key, safe='')}",
                json={"paused": True},
                headers=AUTH_ADMIN,
                timeout=30,
            )
            for key in keys
        }
        refused = {k: (r.status_code, r.text) for k, r in answers.items() if r.status_code != 200}
        assert refused == {}, refused
    finally:
        server.stop()


# --- 10. /docs and /redoc run a floating third-party script on the API's origin ---------


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_run_no_unpinned_third_party_script(token_api: ApiServer, page: str) -> None:
    """FastAPI's default pages load ``https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/
    swagger-ui-bundle.js`` (any 5.x published, no Subresource Integrity) into the API's
    own origin, with no Content-Security-Policy. Whoever publishes that package (or
    controls the CDN) runs script as the API: the Host/Origin guard lets same-origin
    calls through, so on an open loopback API it submits, purges and pauses; with tokens
    it reads the token typed into Swagger's Authorize dialog, and for an admin logged in
    to the dashboard it reads a page's CSRF token and posts its forms with the cookie.
    Serve the assets from the package (or pin them with ``integrity``), or leave the
    pages off (``docs_url=None``) unless asked for."""
    got = httpx.get(f"{token_api.url}{page}", timeout=30)
    assert got.status_code in (200, 404), got.text[:200]
    if got.status_code == 404:
        return  # the page is off: fixed that way
    scripts = re.findall(r"<script[^>]*\bsrc=[\"']([^\"']+)[\"'][^>]*>", got.text)
    tags = re.findall(r"<script[^>]*\bsrc=[^>]*>", got.text)
    foreign = [
        tag
        for tag, src in zip(tags, scripts, strict=True)
        if src.startswith(("http:", "https:", "//")) and "integrity=" not in tag
    ]
    assert foreign == [], foreign


# --- 11. a read token reads the credentials stored with requests -------------------------


def test_a_read_token_does_not_read_stored_credentials(
    token_api: ApiServer, redis7_client: redis.Redis
) -> None:
    """Read tokens are for looking (Prometheus, Grafana, the dashboard's viewers); the
    requests a crawl stores carry what it needs to fetch them: ``Authorization`` or
    ``Cookie`` headers of a site behind a login, a ``meta["proxy"]`` with its user and
    password (Scrapy's HttpProxyMiddleware reads them there). ``GET
    /v1/crawls/{crawl}/requests/{id}`` hands all of it to any read token:

        {"headers": [["Authorization", "Bearer SITE-SECRET-1"], ["Cookie", ...]],
         "meta": {"proxy": "http://crawler:PROXY-SECRET-2@proxy.example:8080"}, ...}

    Redact those values (or leave headers, body and meta to admin tokens)."""
    sent = {
        "requests": [
            {
                "url": "https://example.com/account",
                "headers": {
                    "Authorization": "Bearer SITE-SECRET-1",
                    "Cookie": "session=SITE-SECRET-3",
                },
                "meta": {"proxy": "http://crawler:PROXY-SECRET-2@proxy.example:8080"},
            }
        ]
    }
    submitted = httpx.post(
        f"{token_api.url}/v1/crawls/c/requests", json=sent, headers=AUTH_ADMIN, timeout=30
    )
    assert submitted.status_code == 200, submitted.text
    rid = submitted.json()["items"][0]["id"]
    got = httpx.get(f"{token_api.url}/v1/crawls/c/requests/{rid}", headers=AUTH_READ, timeout=30)
    assert got.status_code == 200, got.text
    leaked = [s for s in ("SITE-SECRET-1", "PROXY-SECRET-2", "SITE-SECRET-3") if s in got.text]
    assert leaked == [], got.text


# --- 12. the dashboard shows any text a link puts in ?done= -------------------------------


def test_the_dashboard_flash_shows_only_its_own_messages(
    token_api: ApiServer, redis7_client: redis.Redis
) -> None:
    """After an action the dashboard redirects to ``/crawls/{crawl}?done=paused`` and
    shows ``done`` in a banner. Any link can carry its own text there, shown inside the
    trusted page to a logged-in operator (escaped, so no markup, but words: "Session
    expired: paste your admin token at https://evil.example/login"). The banner should
    show only the messages the actions produce (paused, resumed, requeued N)."""
    submitted = httpx.post(
        f"{token_api.url}/v1/crawls/c/requests",
        json={"requests": [{"url": "https://example.com/"}]},
        headers=AUTH_ADMIN,
        timeout=30,
    )
    assert submitted.status_code == 200, submitted.text
    bait = "Session expired: paste your admin token at https://evil.example/login"
    got = httpx.get(
        f"{token_api.url}/crawls/c",
        params={"done": bait},
        headers=AUTH_ADMIN,
        timeout=30,
    )
    assert got.status_code == 200, got.text[:300]
    assert "evil.example" not in got.text, re.findall(r"<p class=flash[^<]*</p>", got.text)


# --- 13. an open API with REDCRAWL_API_ALLOWED_HOSTS=* is open to DNS rebinding ----------


def test_open_api_with_any_host_allowed_is_not_open_to_dns_rebinding(
    tmp_path: Path, redis7: RedisServer
) -> None:
    """Without tokens, the Host check is the API's only protection against web pages
    (api/hosts.py: DNS rebinding). ``REDCRAWL_API_ALLOWED_HOSTS=*`` (meant for a proxy's
    name) switches it off, and ``serve`` starts saying only "open WITHOUT authentication,
    on loopback only": a page on ``evil.example`` re-pointed at 127.0.0.1 is then
    same-origin with the API and submits and purges (its Origin matches its Host):

        curl -X DELETE -H 'Host: evil.example:8798' -H 'Origin: http://evil.example:8798'
          http://127.0.0.1:8798/v1/crawls/rebound   ->  {"crawl":"rebound","purged":true}

    ``check_bind`` should refuse an allowed host list beyond loopback names without
    tokens (as it refuses a non-loopback address)."""
    # fixed by refusing at start (serve, as `redcrawl serve` runs it; it would otherwise
    # serve until the timeout)
    got = _redcrawl(
        tmp_path,
        "serve",
        "--port",
        str(_free_port()),
        REDCRAWL_REDIS_URL=redis7.url,
        REDCRAWL_API_ALLOWED_HOSTS="*",
    )
    assert got.returncode == 2, got.stdout + got.stderr
    assert "REDCRAWL_API_ALLOWED_HOSTS" in got.stderr, got.stderr
