"""UpsertPipeline against real databases: SQLite files and a throwaway PostgreSQL server.

The core tests are parametrized over both sinks (``backend`` fixture). Stored rows are
read back with plain sqlite3 / psycopg queries, not through the code under test.
Multi-process tests (3 concurrent writers; a writer SIGKILLed mid-stream; a real Scrapy
crawl) run their workers as separate Python processes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs
import pytest
import scrapy
from scrapy import Spider
from scrapy.exceptions import DropItem, NotConfigured
from scrapy.pipelines import ItemPipelineManager
from scrapy.utils.test import get_crawler

from redcrawl.errors import ConfigError
from redcrawl.scrapy import lifecycle
from redcrawl.scrapy.pipelines import (
    PostgresSink,
    SQLiteSink,
    UpsertPipeline,
    read_items,
    sink_from_uri,
)

from .conftest import need_module
from .pg import postgres_dsn

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = "redcrawl.scrapy.pipelines.UpsertPipeline"


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """DSN of an empty database on a real PostgreSQL server, shared by the session."""
    need_module("psycopg", 'pip install "psycopg[binary]"')
    with postgres_dsn() as dsn:
        yield dsn


class Backend:
    """A database plus a table of its own, and direct (not via the pipeline) reads."""

    def __init__(
        self, kind: str, uri: str, table: str, dsn: str | None = None, path: Path | None = None
    ) -> None:
        self.kind, self.uri, self.table, self.dsn, self.path = kind, uri, table, dsn, path

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        sql = sql.replace("{t}", f'"{self.table}"')
        if self.kind == "sqlite":
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(sqlite3.connect(self.path)) as conn, conn:
                return conn.execute(sql).fetchall()
        import psycopg

        assert self.dsn is not None
        with psycopg.connect(self.dsn) as pg:
            cursor = pg.execute(sql)
            return cursor.fetchall() if cursor.description else []

    def rows(self) -> dict[str, dict[str, Any]]:
        """key -> {"item": dict, "version": int, "spider": str, "first_seen", "updated_at"}"""
        out = {}
        for key, item, version, spider, first, updated in self.query(
            "SELECT key, item, version, spider, first_seen, updated_at FROM {t}"
        ):
            out[key] = {
                "item": json.loads(item) if isinstance(item, str) else item,
                "version": version,
                "spider": spider,
                "first_seen": first,
                "updated_at": updated,
            }
        return out

    def count(self) -> int:
        return int(self.query("SELECT count(*) FROM {t}")[0][0])


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    table = f"items_{uuid.uuid4().hex[:10]}"
    if request.param == "sqlite":
        path = tmp_path / "db" / "items.db"
        return Backend("sqlite", f"sqlite:///{path}", table, path=path)  # abs: sqlite:////…
    dsn = request.getfixturevalue("pg_dsn")
    return Backend("postgres", dsn, table, dsn=dsn)


class ItemsSpider(Spider):
    name = "items_spider"


def make_pipeline(backend: Backend, **settings: Any) -> tuple[UpsertPipeline, Any]:
    crawler = get_crawler(
        ItemsSpider,
        {"REDCRAWL_ITEMS_URI": backend.uri, "REDCRAWL_ITEMS_TABLE": backend.table, **settings},
    )
    pipeline = UpsertPipeline.from_crawler(crawler)
    pipeline.open_spider()  # as recent Scrapy calls it: no spider argument
    return pipeline, crawler


# --- item types -----------------------------------------------------------------------------


class Product(scrapy.Item):
    url = scrapy.Field()
    title = scrapy.Field()
    price = scrapy.Field()


@dataclasses.dataclass
class Article:
    url: str
    title: str
    tags: list[str] = dataclasses.field(default_factory=list)


@attrs.define
class Page:
    url: str
    status: int
    meta: dict[str, Any] = attrs.Factory(dict)


# --- core behaviour, both sinks ---------------------------------------------------------------


def test_upsert_keeps_one_row_per_key_and_bumps_version(backend: Backend) -> None:
    pipeline, crawler = make_pipeline(backend)
    pipeline.process_item({"url": "https://a/", "title": "first"})
    pipeline.process_item({"url": "https://b/", "title": "b"})
    first_seen = backend.rows()["https://a/"]["first_seen"]
    returned = pipeline.process_item({"url": "https://a/", "title": "second"})
    pipeline.process_item({"url": "https://a/", "title": "third", "extra": [1, 2]})
    pipeline.close_spider()

    assert returned == {"url": "https://a/", "title": "second"}  # the item passes on
    rows = backend.rows()
    assert sorted(rows) == ["https://a/", "https://b/"]
    assert rows["https://a/"]["item"] == {"url": "https://a/", "title": "third", "extra": [1, 2]}
    assert rows["https://a/"]["version"] == 3
    assert rows["https://b/"]["version"] == 1
    assert rows["https://a/"]["spider"] == "items_spider"
    assert rows["https://a/"]["first_seen"] == first_seen  # kept by the rewrites
    assert rows["https://a/"]["updated_at"] >= first_seen
    assert crawler.stats.get_value("redcrawl/items_written") == 4
    assert crawler.stats.get_value("redcrawl/items_inserted") == 2  # a/ and b/
    assert crawler.stats.get_value("redcrawl/items_updated") == 2  # a/ twice more
    assert crawler.stats.get_value("redcrawl/items_dropped") is None
    assert read_items(backend.uri, backend.table) == {k: r["item"] for k, r in rows.items()}


def test_refetch_after_crash_leaves_row_count_unchanged(backend: Backend) -> None:
    items = [{"url": f"https://site/{i}", "n": i} for i in range(50)]
    first, _ = make_pipeline(backend)
    for item in items:
        first.process_item(item)
    # "Crash": the first pipeline is never closed. The requests are fetched again by a
    # fresh worker, which also gets to some new pages.
    second, crawler = make_pipeline(backend)
    for item in [*items, *({"url": f"https://site/new{i}", "n": -i} for i in range(10))]:
        second.process_item(item)
    second.close_spider()
    first.close_spider()

    rows = backend.rows()
    assert backend.count() == len(rows) == 60
    assert all(rows[f"https://site/{i}"]["version"] == 2 for i in range(50))
    assert all(rows[f"https://site/new{i}"]["version"] == 1 for i in range(10))
    assert rows["https://site/7"]["item"] == {"url": "https://site/7", "n": 7}
    assert crawler.stats.get_value("redcrawl/items_written") == 60


def test_dict_scrapy_item_dataclass_and_attrs_items(backend: Backend) -> None:
    pipeline, crawler = make_pipeline(backend)
    product = Product(url="https://shop/p1", title="Kettle", price=19.5)
    article = Article(url="https://news/a1", title="Héllo wörld ✓", tags=["x", "y"])
    page = Page(url="https://site/p", status=200, meta={"depth": 2, "nested": {"ok": True}})
    nested = {
        "url": "https://shop/bundle",
        "products": [Product(url="u1", title="t1")],
        "article": Article(url="u2", title="t2"),
    }
    for item in (product, article, page, nested, {"url": "https://d/", "v": None}):
        assert pipeline.process_item(item) is item
    pipeline.close_spider()

    assert read_items(backend.uri, backend.table) == {
        "https://shop/p1": {"url": "https://shop/p1", "title": "Kettle", "price": 19.5},
        "https://news/a1": {"url": "https://news/a1", "title": "Héllo wörld ✓", "tags": ["x", "y"]},
        "https://site/p": {
            "url": "https://site/p",
            "status": 200,
            "meta": {"depth": 2, "nested": {"ok": True}},
        },
        "https://shop/bundle": {
            "url": "https://shop/bundle",
            "products": [{"url": "u1", "title": "t1"}],
            "article": {"url": "u2", "title": "t2", "tags": []},
        },
        "https://d/": {"url": "https://d/", "v": None},
    }
    assert crawler.stats.get_value("redcrawl/items_written") == 5


@pytest.mark.parametrize(
    "item, state",
    [
        ({"title": "no url"}, "is missing"),
        ({"url": None, "title": "t"}, "is None"),
        ({"url": "", "title": "t"}, "is empty"),
        ({"url": "   ", "title": "t"}, "is empty"),
        (Product(title="declared but unset"), "is missing"),
    ],
)
def test_item_without_key_is_dropped(backend: Backend, item: Any, state: str) -> None:
    pipeline, crawler = make_pipeline(backend)
    with pytest.raises(DropItem, match=f"key field 'url' .*{state}"):
        pipeline.process_item(item)
    pipeline.process_item({"url": "https://ok/"})  # the pipeline carries on
    pipeline.close_spider()
    assert list(backend.rows()) == ["https://ok/"]
    assert crawler.stats.get_value("redcrawl/items_dropped") == 1
    assert crawler.stats.get_value("redcrawl/items_written") == 1


def test_a_key_field_items_do_not_have_is_said_once_with_their_fields(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """An outside tester's REDCRAWL_ITEM_KEY named a field the items did not have: every
    item was dropped with a WARNING of its own (Scrapy's DropItem) and nothing said what
    to change. One ERROR names the setting and the fields the items do have."""
    pipeline, crawler = make_pipeline(backend, REDCRAWL_ITEM_KEY="sku")
    with caplog.at_level(logging.ERROR, logger="redcrawl.scrapy.pipelines"):
        for i in range(3):
            with pytest.raises(DropItem):
                pipeline.process_item({"url": f"https://a/{i}", "title": "t"})
    pipeline.close_spider()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "REDCRAWL_ITEM_KEY" in errors[0] and "'sku'" in errors[0]
    assert "['title', 'url']" in errors[0]
    assert crawler.stats.get_value("redcrawl/items_dropped") == 3


def test_custom_key_field_and_integer_keys(backend: Backend) -> None:
    pipeline, _ = make_pipeline(backend, REDCRAWL_ITEM_KEY="sku")
    pipeline.process_item({"sku": 1234, "url": "https://a/"})
    pipeline.process_item({"sku": 1234, "url": "https://b/"})  # same sku: same row
    pipeline.process_item({"sku": "X-9", "url": "https://a/"})  # same url: other row
    for bad in ({"sku": True}, {"sku": 1.5}, {"sku": ["a"]}):
        with pytest.raises(DropItem, match=r"key field 'sku' .*must be a string or an integer"):
            pipeline.process_item(bad)
    with pytest.raises(DropItem, match="key field 'sku'"):
        pipeline.process_item({"url": "https://c/"})
    pipeline.close_spider()
    rows = backend.rows()
    assert sorted(rows) == ["1234", "X-9"]
    assert rows["1234"]["version"] == 2
    assert rows["1234"]["item"] == {"sku": 1234, "url": "https://b/"}


@pytest.mark.parametrize(
    "field, value",
    [
        ("body", b"raw bytes"),
        ("fetched", datetime(2024, 1, 1)),
        ("tags", {"a", "b"}),
        ("score", math.nan),
        ("score", math.inf),
        ("nested", {"deep": [1, object()]}),
        ("text", "lone surrogate \ud800"),
    ],
)
def test_unserialisable_value_is_dropped_naming_the_field(
    backend: Backend, field: str, value: Any
) -> None:
    pipeline, crawler = make_pipeline(backend)
    with pytest.raises(DropItem, match=f"field '{field}' is not JSON-serialisable"):
        pipeline.process_item({"url": "https://bad/", "title": "fine", field: value})
    pipeline.process_item({"url": "https://good/", "title": "fine"})
    pipeline.close_spider()
    assert list(backend.rows()) == ["https://good/"]
    assert crawler.stats.get_value("redcrawl/items_dropped") == 1


def test_nul_character(backend: Backend) -> None:
    """SQLite stores NUL in text; PostgreSQL cannot (JSONB): that item alone is dropped."""
    pipeline, crawler = make_pipeline(backend)
    item = {"url": "https://nul/", "text": "a\x00b"}
    if backend.kind == "sqlite":
        pipeline.process_item(item)
        assert backend.rows()["https://nul/"]["item"] == item
    else:
        with pytest.raises(DropItem, match="url='https://nul/' not stored"):
            pipeline.process_item(item)
        assert crawler.stats.get_value("redcrawl/items_dropped") == 1
    pipeline.process_item({"url": "https://after/"})  # the connection still works
    pipeline.close_spider()
    assert "https://after/" in backend.rows()


def test_existing_table_of_another_shape_is_a_config_error(backend: Backend) -> None:
    backend.query("CREATE TABLE {t} (id INTEGER PRIMARY KEY, name TEXT)")
    sink = sink_from_uri(backend.uri, backend.table)
    with pytest.raises(ConfigError, match="not an items table") as info:
        sink.open()
    assert info.value.setting == "REDCRAWL_ITEMS_TABLE"


def test_reserved_word_table_name(backend: Backend) -> None:
    backend.table = f"order_{backend.table}" if backend.kind == "sqlite" else "order"
    if backend.kind == "postgres":
        backend.query('DROP TABLE IF EXISTS "order"')
    pipeline, _ = make_pipeline(backend)
    pipeline.process_item({"url": "u"})
    pipeline.process_item({"url": "u"})
    pipeline.close_spider()
    assert backend.rows()["u"]["version"] == 2


def test_runs_inside_scrapys_pipeline_manager_without_deprecation_warnings(
    backend: Backend,
) -> None:
    # filterwarnings=error: a required `spider` argument would warn (recent Scrapy).
    crawler = get_crawler(
        ItemsSpider,
        {
            "ITEM_PIPELINES": {PIPELINE: 300},
            "REDCRAWL_ITEMS_URI": backend.uri,
            "REDCRAWL_ITEMS_TABLE": backend.table,
        },
    )
    manager = ItemPipelineManager.from_crawler(crawler)
    (pipeline,) = manager.middlewares
    assert isinstance(pipeline, UpsertPipeline)
    assert not manager._mw_methods_requiring_spider
    # Older Scrapy passes the spider; that works too.
    spider = ItemsSpider()
    pipeline.open_spider(spider)
    pipeline.process_item({"url": "x"}, spider)
    pipeline.close_spider(spider)
    assert backend.rows()["x"]["spider"] == "items_spider"


# --- configuration ----------------------------------------------------------------------------


def refusal(crawler: Any) -> str:
    """The CRITICAL line of a wrong setting: the pipeline is left out (NotConfigured) and
    the crawl refused (lifecycle.refuse_start), not failed by a ConfigError out of the
    engine's construction (a traceback, and the spider closed as 'finished')."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign,assignment]
    logger = logging.getLogger(lifecycle.__name__)
    logger.addHandler(handler)
    try:
        with pytest.raises(NotConfigured):
            UpsertPipeline.from_crawler(crawler)
    finally:
        logger.removeHandler(handler)
    assert lifecycle.refused(crawler) == "config_error"
    (critical,) = [r.getMessage() for r in records if r.levelno == logging.CRITICAL]
    return critical


@pytest.mark.parametrize(
    "table",
    ["1items", "items; DROP TABLE x", "my-items", "my items", "", "ítems", 'it"ems', "x" * 64, 42],
)
def test_bad_table_name_is_a_config_error(table: Any, tmp_path: Path) -> None:
    crawler = get_crawler(
        ItemsSpider,
        {"REDCRAWL_ITEMS_URI": f"sqlite:///{tmp_path}/i.db", "REDCRAWL_ITEMS_TABLE": table},
    )
    assert "setting REDCRAWL_ITEMS_TABLE:" in refusal(crawler)
    with pytest.raises(ConfigError, match="REDCRAWL_ITEMS_TABLE"):
        SQLiteSink(tmp_path / "i.db", table)
    assert not (tmp_path / "i.db").exists()


@pytest.mark.parametrize(
    "uri",
    [
        "mysql://u:p@h/db",
        "items.db",
        "/tmp/items.db",
        "sqlite://host/items.db",
        "sqlite:///",
        "sqlite:////tmp/",
        "",
        "redis://localhost:6379/0",
        5,
    ],
)
def test_bad_uri_is_a_config_error(uri: Any) -> None:
    crawler = get_crawler(ItemsSpider, {"REDCRAWL_ITEMS_URI": uri})
    assert "setting REDCRAWL_ITEMS_URI:" in refusal(crawler)


def test_password_is_not_echoed_in_uri_errors() -> None:
    with pytest.raises(ConfigError) as info:
        sink_from_uri("mysql://user:s3cret@db.example:3306/items")
    assert "s3cret" not in str(info.value)
    assert "mysql://user:***@db.example:3306/items" in str(info.value)


def test_empty_item_key_is_a_config_error(tmp_path: Path) -> None:
    crawler = get_crawler(
        ItemsSpider, {"REDCRAWL_ITEMS_URI": f"sqlite:///{tmp_path}/i.db", "REDCRAWL_ITEM_KEY": ""}
    )
    assert "setting REDCRAWL_ITEM_KEY:" in refusal(crawler)


def test_default_and_relative_sqlite_uris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = UpsertPipeline.from_crawler(get_crawler(ItemsSpider))
    assert isinstance(default.sink, SQLiteSink)
    assert default.sink.path == Path("items.db") and default.sink.table == "items"
    assert default.key_field == "url"
    default.open_spider()
    default.process_item({"url": "d"})
    default.close_spider()
    assert (tmp_path / "items.db").is_file()
    assert read_items("sqlite:///items.db") == {"d": {"url": "d"}}

    rel = sink_from_uri("sqlite:///out/sub/crawl.db", "t")
    assert isinstance(rel, SQLiteSink) and rel.path == Path("out/sub/crawl.db")
    rel.open()
    rel.upsert("k", '{"url": "k"}', "s")
    rel.close()
    assert (tmp_path / "out" / "sub" / "crawl.db").is_file()  # parent folders created
    assert read_items(f"sqlite:///{tmp_path}/out/sub/crawl.db", "t") == {"k": {"url": "k"}}


def test_read_items_missing_table_and_missing_file(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/i.db"
    sink = sink_from_uri(uri, "present")
    sink.open()
    sink.close()
    assert read_items(uri, "absent") == {}
    with pytest.raises(FileNotFoundError, match="no SQLite database"):
        read_items(f"sqlite:///{tmp_path}/nope.db")
    assert not (tmp_path / "nope.db").exists()  # reading creates nothing


def test_postgres_uri_gives_postgres_sink_and_missing_table_reads_empty(pg_dsn: str) -> None:
    sink = sink_from_uri(pg_dsn, "t1")
    assert isinstance(sink, PostgresSink)
    assert isinstance(sink_from_uri(pg_dsn.replace("postgresql://", "postgres://")), PostgresSink)
    assert read_items(pg_dsn, "never_created") == {}


def test_missing_psycopg_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes `import psycopg` fail
    with pytest.raises(ConfigError, match=r'pip install "redcrawl\[postgres\]"') as info:
        sink_from_uri("postgresql://u@localhost/db")
    assert info.value.setting == "REDCRAWL_ITEMS_URI"
    # SQLite needs nothing extra.
    assert isinstance(sink_from_uri("sqlite:///x.db"), SQLiteSink)


def test_module_does_not_import_psycopg() -> None:
    code = (
        "import sys, redcrawl.scrapy.pipelines as p; "
        "p.sink_from_uri('sqlite:///x.db'); assert 'psycopg' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=_child_env(), timeout=60)


def test_postgres_reconnects_after_losing_its_connection(pg_dsn: str) -> None:
    import psycopg

    table = f"items_{uuid.uuid4().hex[:10]}"
    sink = PostgresSink(pg_dsn, table)
    sink.open()
    sink.upsert("a", '{"url": "a"}', "s")
    pid = sink._conn.info.backend_pid
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    sink.upsert("a", '{"url": "a", "v": 2}', "s")  # reconnects, retries once
    sink.close()
    assert read_items(pg_dsn, table) == {"a": {"url": "a", "v": 2}}


# --- multi-process ------------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}


WRITER = r"""
import sys
from scrapy import Spider
from scrapy.utils.test import get_crawler
from redcrawl.scrapy.pipelines import UpsertPipeline

uri, table, worker, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spider = Spider(name=f"writer{worker}")
crawler = get_crawler(Spider, {"REDCRAWL_ITEMS_URI": uri, "REDCRAWL_ITEMS_TABLE": table})
pipeline = UpsertPipeline.from_crawler(crawler)
print("ready", flush=True)
sys.stdin.readline()  # start line: all writers open the fresh database at once
pipeline.open_spider(spider)
orders = [range(n), range(n - 1, -1, -1), [(i * 7) % n for i in range(n)]]
for i in orders[worker % 3]:
    pipeline.process_item({"url": f"k{i}", "writer": worker}, spider)
pipeline.close_spider(spider)
print("written", crawler.stats.get_value("redcrawl/items_written"), flush=True)
"""


def test_three_processes_write_overlapping_keys_concurrently(backend: Backend) -> None:
    n = 500
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, backend.uri, backend.table, str(w), str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_child_env(),
        )
        for w in range(3)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:  # release them together
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert "locked" not in err and "Traceback" not in err, err
        assert out.strip() == f"written {n}"
    rows = backend.rows()
    assert backend.count() == len(rows) == n
    assert sorted(rows) == sorted(f"k{i}" for i in range(n))
    # Every one of the 3 * n upserts landed: no write was lost to a race.
    assert {r["version"] for r in rows.values()} == {3}
    assert sum(r["version"] for r in rows.values()) == 3 * n
    if backend.kind == "sqlite":
        assert backend.query("PRAGMA journal_mode") == [("wal",)]


# Not a round number: a pipeline committing in batches of 10, 50, 64, 100… would have
# reported items of its open batch as done when the kill lands.
KILL_AFTER = 437


def _report_then_kill(proc: subprocess.Popen[bytes]) -> list[int]:
    """Read the child's reports; SIGKILL it after KILL_AFTER. Returns every complete report."""
    assert proc.stdout is not None and proc.stderr is not None
    reported: list[int] = []
    try:
        for line in proc.stdout:
            reported.append(int(line))
            if len(reported) == KILL_AFTER:
                os.kill(proc.pid, signal.SIGKILL)  # mid-stream, mid-whatever-it-was-doing
                break
        # What it managed to report before dying counts too (complete lines only).
        rest = proc.stdout.read()
        reported += [int(x) for x in rest.split(b"\n")[:-1]]
        assert proc.wait(timeout=30) == -signal.SIGKILL, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return reported


KILLED_WRITER = r"""
import sys
from scrapy import Spider
from scrapy.utils.test import get_crawler
from redcrawl.scrapy.pipelines import UpsertPipeline

uri, table = sys.argv[1], sys.argv[2]
crawler = get_crawler(Spider, {"REDCRAWL_ITEMS_URI": uri, "REDCRAWL_ITEMS_TABLE": table})
pipeline = UpsertPipeline.from_crawler(crawler)
pipeline.open_spider(Spider(name="doomed"))
out = sys.stdout
for i in range(10_000_000):
    pipeline.process_item({"url": f"https://site/{i}", "n": i, "body": "x" * 200})
    out.write(f"{i}\n")  # reported only after process_item returned
    out.flush()
"""


def test_items_reported_done_survive_sigkill(backend: Backend) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, backend.uri, backend.table],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_env(),
    ) as proc:
        reported = _report_then_kill(proc)
    assert len(reported) >= KILL_AFTER
    assert reported == list(range(len(reported)))

    rows = backend.rows()
    missing = [i for i in reported if f"https://site/{i}" not in rows]
    assert not missing, f"{len(missing)} items reported done but not committed: {missing[:10]}"
    for i in reported:
        assert rows[f"https://site/{i}"]["item"] == {
            "url": f"https://site/{i}",
            "n": i,
            "body": "x" * 200,
        }
    # At most the one item in flight at the kill is stored without having been reported.
    assert len(rows) - len(reported) in (0, 1)
    if backend.kind == "sqlite":
        assert backend.query("PRAGMA integrity_check") == [("ok",)]


CRAWL = r"""
import json, sys
from scrapy import Spider
from scrapy.crawler import CrawlerProcess

uri, table, run = sys.argv[1], sys.argv[2], sys.argv[3]

class CatalogueSpider(Spider):
    name = "catalogue"
    start_urls = [f"data:,page{p}" for p in range(3)]

    def parse(self, response):
        page = response.text
        for i in range(5):
            yield {"url": f"https://shop/{page}/{i}", "run": run, "page": page}
        yield {"title": "an item without a url"}

process = CrawlerProcess({
    "ITEM_PIPELINES": {"redcrawl.scrapy.pipelines.UpsertPipeline": 300},
    "REDCRAWL_ITEMS_URI": uri,
    "REDCRAWL_ITEMS_TABLE": table,
    "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": False,
})
crawler = process.create_crawler(CatalogueSpider)
process.crawl(crawler)
process.start()
stats = crawler.stats.get_stats()
print(json.dumps({k: v for k, v in stats.items() if k.startswith("redcrawl/")}))
"""


def test_real_scrapy_crawl_twice_keeps_one_row_per_item(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/crawl.db"
    for run in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", CRAWL, uri, "catalogue", run],
            capture_output=True,
            text=True,
            env=_child_env(),
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert "Deprecat" not in result.stderr, result.stderr
        assert json.loads(result.stdout.splitlines()[-1]) == {
            "redcrawl/items_written": 15,
            # the second run stores the same keys again: every item is a duplicate
            "redcrawl/items_inserted" if run == "1" else "redcrawl/items_updated": 15,
            "redcrawl/items_dropped": 3,
        }
    items = read_items(uri, "catalogue")
    assert len(items) == 15
    assert {item["run"] for item in items.values()} == {"2"}
    with closing(sqlite3.connect(tmp_path / "crawl.db")) as conn:
        assert conn.execute(
            "SELECT min(version), max(version), min(spider) FROM catalogue"
        ).fetchone() == (2, 2, "catalogue")
