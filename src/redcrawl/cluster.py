"""Redis Cluster clients: ``redis+cluster://host:port[,host:port...]`` (``rediss+cluster://``
with TLS) gives a :class:`ClusterClient`, redis-py's ``RedisCluster`` made to wait out a
failover or an outage as a single-server client does, and to run what redcrawl needs
(scripts and TIME in pipelines; INFO, SCAN, KEYS, DBSIZE and CONFIG over every master).
:func:`redcrawl.connection.connect` builds it from such a URL; docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import redis
import redis.connection
import redis.exceptions
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster, TransactionStrategy
from redis.retry import Retry

from redcrawl import scripts
from redcrawl.connection import (
    SOCKET_TIMEOUT,
    _tls_fix,
    check_userinfo,
    login_refused,
    redact,
    refuse_tls_at_plain,
    scrub,
)
from redcrawl.errors import ConfigError, RedisUnavailable
from redcrawl.settings import Settings

__all__ = [
    "CLUSTER_SCHEMES",
    "ClusterClient",
    "cluster_nodes",
    "connect_cluster",
    "is_cluster_url",
    "merge_infos",
]

log = logging.getLogger(__name__)

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""URL schemes of a Redis Cluster, and the plain scheme each stands for (TLS or not)."""

CLUSTER_TRANSIENT: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    # CLUSTERDOWN, MASTERDOWN (during a failover), and redis-py's own "TTL exhausted.":
    # its 16 tries of following redirections (MOVED, ASK, TRYAGAIN while a slot's keys are
    # split by a migration: ~0.4 s) ran out. A frontier call that changes state carries a
    # nonce (call_replay in ops.lua), so sending it again is safe
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,  # a multi-key command during resharding
    redis.exceptions.SlotNotCoveredError,
)
"""What a cluster client waits out (a failover, a node restarting) before giving up."""

_NOT_TRANSIENT = (redis.exceptions.AuthenticationError, redis.exceptions.MaxConnectionsError)

OUTAGE = 30.0
"""Seconds a cluster client keeps retrying a command through a failover or an outage
(as long as a single-server client's :data:`RETRIES` take)."""


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster: ``redis+cluster://host:port[,host:port...]``
    or ``rediss+cluster://`` (TLS)."""
    return bool(url) and str(url).partition("://")[0].lower() in CLUSTER_SCHEMES


def cluster_nodes(
    url: str, first: tuple[str, int] | None = None
) -> tuple[str, list[tuple[str, int]]]:
    """The plain URL (``redis://`` or ``rediss://``, credentials, database and query kept,
    the first node, or ``first``, as its host) and the (host, port) of every node a
    cluster URL names. :class:`ConfigError` when the URL is not one."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if plain is None or not sep:
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"{redact(url)}: a Redis Cluster URL starts with redis+cluster:// or "
            "rediss+cluster:// (TLS)",
        )
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, at, hosts = netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, port = _host_port(item.strip(), url)
        nodes.append((host, port))
    if tail.startswith("/") and tail[1:].partition("?")[0] not in ("", "0"):
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"{redact(url)}: a Redis Cluster has only database 0; remove "
            f"{tail.partition('?')[0]!r} from the URL",
        )
    first = first or nodes[0]
    host = f"[{first[0]}]" if ":" in first[0] else first[0]
    return f"{plain}://{userinfo}{at}{host}:{first[1]}{tail}", nodes


def _host_port(item: str, url: str) -> tuple[str, int]:
    if not item:
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"{redact(url)}: name the cluster's nodes as host:port[,host:port...]",
        )
    if item.startswith("["):  # [IPv6]:port
        host, _, port = item[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
    try:
        number = int(port) if port else 6379
    except ValueError:
        number = -1
    if not host or not 0 < number < 65536:
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"{redact(url)}: {item!r} is not host:port; name the cluster's nodes as "
            "host:port[,host:port...]",
        )
    return host, number


class ClusterClient(RedisCluster):
    """redis-py's ``RedisCluster`` as redcrawl uses it: a command (and a pipeline) that
    fails because a node is unreachable or the cluster is reconfiguring (a failover,
    :data:`CLUSTER_TRANSIENT`) is retried with exponential backoff for up to
    :data:`OUTAGE` seconds, the topology refreshed before each retry, as a single-server
    client waits out an outage. (redis-py's own cluster retries follow each other
    without a pause, so a failover's few seconds would exhaust them.)

    A retried script call is safe: every state-changing frontier script carries a nonce
    and replays its first outcome (see ``frontier/lua/ops.lua``).

    ``outage`` (seconds, default :data:`OUTAGE`) bounds that wait, for this client and
    its pipelines: a reader that must not stall (``redcrawl crawl``'s progress reads) gives
    a short one.
    """

    def __init__(self, *args: Any, outage: float = OUTAGE, **kwargs: Any) -> None:
        self.outage = outage
        super().__init__(*args, **kwargs)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        run: Any = super().execute_command
        return _waiting(self, lambda: run(*args, **kwargs))

    def close(self) -> None:
        """Close every node's connections. (redis-py 8's ``close`` gives a node's open
        connection back to its pool without closing the pool when the client was built
        from a URL, as here: its sockets stayed open until garbage collection.)"""
        manager = getattr(self, "nodes_manager", None)
        nodes = list(manager.nodes_cache.values()) if manager is not None else []
        super().close()
        for node in nodes:
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()

    def keys(self, pattern: Any = "*", **kwargs: Any) -> Any:
        """KEYS on every master (redis-py asks one node only), results merged."""
        kwargs.setdefault("target_nodes", self.PRIMARIES)
        return super().keys(pattern, **kwargs)

    def dbsize(self, **kwargs: Any) -> Any:
        """The number of keys on every master, summed (redis-py asks one node only)."""
        kwargs.setdefault("target_nodes", self.PRIMARIES)
        return super().dbsize(**kwargs)

    def config_set(self, name: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        """CONFIG SET on every master (redis-py sets it on one node only)."""
        kwargs.setdefault("target_nodes", self.PRIMARIES)
        return super().config_set(name, value, *args, **kwargs)

    def config_get(self, pattern: Any = "*", *args: Any, **kwargs: Any) -> Any:
        """CONFIG GET of every master, one dict: a value the masters disagree on is the
        smallest number (the limit that binds), else the first master's."""
        if "target_nodes" in kwargs:
            return super().config_get(pattern, *args, **kwargs)
        per_node: Any = super().config_get
        rows = [dict(per_node(pattern, *args, target_nodes=n)) for n in self.masters()]
        out = dict(rows[0]) if rows else {}
        for key, first in out.items():
            values = [r.get(key, first) for r in rows]
            numbers = [_as_int(v) for v in values]
            if len(set(values)) > 1 and None not in numbers:
                out[key] = values[numbers.index(min(n for n in numbers if n is not None))]
        return out

    def info(self, section: Any = None, *args: Any, **kwargs: Any) -> Any:
        """INFO of the whole cluster: every master's, merged by :func:`merge_infos`
        (counters such as used_memory summed, statuses the worst). With ``target_nodes``:
        redis-py's INFO of those nodes."""
        if "target_nodes" in kwargs:
            return super().info(section, *args, **kwargs)
        return merge_infos(self.master_infos(section))

    def master_infos(self, section: str | None = None) -> dict[str, dict[str, Any]]:
        """INFO (``section``) of each master: node name (host:port) -> INFO."""
        args = () if section is None else (section,)
        out = {}
        for node in self.masters():
            out[node.name] = super().info(*args, target_nodes=node)
        return out

    def masters(self) -> list[ClusterNode]:
        """The cluster's masters, by name (host:port)."""
        me: Any = self
        return sorted(me.get_primaries(), key=lambda n: str(n.name))

    def scan(
        self,
        cursor: int = 0,
        match: Any = None,
        count: int | None = None,
        _type: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """SCAN over the whole cluster, with a single-server SCAN's reply: ``(cursor,
        keys)``, the cursor 0 once every master was scanned. The cursor holds the master
        (its low 8 bits: the index among :meth:`masters`) and that master's own cursor.
        A pattern whose hash tag is literal (``rc:{crawl}:pq:*``) scans only the master of
        that tag's slot. With ``target_nodes``: redis-py's per-node SCAN."""
        if "target_nodes" in kwargs:
            return super().scan(cursor, match, count, _type, **kwargs)
        masters = self._scanned(match)
        index, node_cursor = int(cursor) & 0xFF, int(cursor) >> 8
        if index >= len(masters):
            return 0, []
        node = masters[index]
        per_node: Any = super().scan
        cursors, keys = per_node(node_cursor, match, count, _type, target_nodes=node)
        node_cursor = int(cursors[node.name])
        if node_cursor == 0:
            index, node_cursor = index + 1, 0
            if index >= len(masters):
                return 0, keys
        return (node_cursor << 8) | index, keys

    def scan_iter(
        self, match: Any = None, count: int | None = None, _type: str | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """Every key matching ``match`` on every master (see :meth:`scan`)."""
        if "target_nodes" in kwargs:
            yield from super().scan_iter(match, count, _type, **kwargs)
            return
        cursor = 0
        while True:
            cursor, keys = self.scan(cursor, match, count, _type)
            yield from keys
            if cursor == 0:
                return

    def _scanned(self, match: Any) -> list[ClusterNode]:
        """The masters a SCAN for ``match`` must visit: the one of its slot if every key
        it matches has the same hash tag, else all of them."""
        text = match.decode() if isinstance(match, bytes) else match
        if isinstance(text, str) and "{" in text:
            head = text[: text.find("}", text.find("{")) + 1]
            if (
                head.endswith("}")
                and head.index("{") + 2 < len(head)
                and not any(c in head for c in "*?[\\")
            ):
                me: Any = self
                return [me.nodes_manager.get_node_from_slot(me.keyslot(head))]
        return self.masters()

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        if shard_hint:
            raise redis.exceptions.RedisClusterException("shard_hint is deprecated in cluster mode")
        pipe = _WaitingPipeline(
            nodes_manager=self.nodes_manager,
            commands_parser=self.commands_parser,
            startup_nodes=self.nodes_manager.startup_nodes,
            result_callbacks=self.result_callbacks,
            cluster_response_callbacks=self.cluster_response_callbacks,
            read_from_replicas=self.read_from_replicas,
            load_balancing_strategy=self.load_balancing_strategy,
            reinitialize_steps=self.reinitialize_steps,
            retry=self.retry,
            lock=self._lock,
            transaction=transaction,
            event_dispatcher=self._event_dispatcher,
        )
        pipe.outage = self.outage
        return pipe


class _WaitingPipeline(ClusterPipeline):
    """A cluster pipeline whose :meth:`execute` waits out a failover like
    :class:`ClusterClient` (its commands are queued again for each retry). It also
    answers what redis-py refuses in a cluster pipeline: ``TIME`` (from the master of the
    pipeline's first key) and ``INFO`` (:meth:`ClusterClient.info`: every master's,
    merged), each sent just after the pipeline (outside a transaction's MULTI/EXEC) and
    its reply put in its place among the others."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outage = OUTAGE
        """How long :meth:`execute` waits out trouble (its client's ``outage``)."""
        self._aside: list[tuple[int, str, tuple[Any, ...]]] = []
        self.load_scripts_first = True
        """Whether :meth:`execute` checks (``SCRIPT EXISTS``) and loads the scripts of
        its EVALSHAs first; off for a caller that handles ``NOSCRIPT`` itself and would
        rather save the round trip (``REDCRAWL_WAIT_REPLICAS``'s calls)."""

    def _set_aside(self, name: str, *args: Any) -> Any:
        at = len(self._execution_strategy.command_queue) + len(self._aside)
        self._aside.append((at, name, args))
        return self

    def time(self, **kwargs: Any) -> Any:
        return self._set_aside("TIME")

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """A script call in the pipeline (redis-py refuses it in a cluster pipeline); the
        script is loaded first on the masters that lack it (:meth:`execute`)."""
        me: Any = self
        return me.pipeline_execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    def _load_scripts(self, queued: list[Any]) -> None:
        """SCRIPT LOAD, on every master, the scripts of the queued EVALSHAs that some
        master lacks (as redis-py's single-server pipeline does before it runs)."""
        shas = sorted({str(c.args[1]) for c in queued if str(c.args[0]).upper() == "EVALSHA"})
        if not shas:
            return
        me: Any = self
        found = me.parent_execute_command("SCRIPT EXISTS", *shas)
        for sha, there in zip(shas, found, strict=True):
            text = scripts.by_sha(sha)
            if not there and text is not None:
                me.parent_execute_command("SCRIPT LOAD", text)

    def info(self, section: Any = None, *args: Any, **kwargs: Any) -> Any:
        return self._set_aside("INFO", section)

    def reset(self) -> None:  # type: ignore[override]  # (a pipeline's reset, not RESET)
        parent: Any = super()
        parent.reset()
        self._aside = []

    def _parsed(self, queued: list[Any], replies: list[Any]) -> list[Any]:
        """The replies of a transaction through redis-py's response callbacks (redis-py
        8.1 leaves a cluster transaction's replies raw: HGETALL a list, XPENDING a list,
        where a single server's pipeline gives a dict)."""
        me: Any = self
        callbacks = me.get_default_node().redis_connection.response_callbacks
        out = []
        for cmd, reply in zip(queued, replies, strict=True):
            name = cmd.args[0]
            if not isinstance(reply, Exception) and name in callbacks:
                options = {k: v for k, v in cmd.options.items() if k != "keys"}
                reply = callbacks[name](reply, **options)
            out.append(reply)
        return out

    def _aside_reply(self, name: str, args: tuple[Any, ...], queued: list[Any]) -> Any:
        me: Any = self
        if name == "INFO":
            infos = {}
            for node in sorted(me.get_primaries(), key=lambda n: str(n.name)):
                infos[node.name] = me.parent_execute_command(
                    "INFO", *(a for a in args if a is not None), target_nodes=node
                )
            return merge_infos(infos)
        target = (
            me.nodes_manager.get_node_from_slot(me.determine_slot(*queued[0].args))
            if queued
            else me.get_default_node()
        )
        return me.parent_execute_command("TIME", target_nodes=target)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        queued = list(self._execution_strategy.command_queue)
        # (redis-py pops a command's target_nodes as it sends it: kept for a retry)
        options = [dict(cmd.options) for cmd in queued]
        aside = list(self._aside)

        def run() -> list[Any]:
            if not self._execution_strategy.command_queue and queued:
                me: Any = self
                for cmd, given in zip(queued, options, strict=True):
                    me.pipeline_execute_command(*cmd.args, **given)
            if self.load_scripts_first:
                self._load_scripts(queued)
            out = list(super(_WaitingPipeline, self).execute(raise_on_error)) if queued else []
            if isinstance(self._execution_strategy, TransactionStrategy):
                out = self._parsed(queued, out)
            for at, name, args in aside:
                try:
                    reply = self._aside_reply(name, args, queued)
                except redis.exceptions.ResponseError as exc:
                    if raise_on_error:
                        raise
                    reply = exc
                out.insert(at, reply)
            return out

        try:
            return cast(list[Any], _waiting(self, run))
        finally:
            self.reset()


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


_SUMMED_INFO = frozenset(
    (
        "used_memory",
        "used_memory_rss",
        "used_memory_dataset",
        "maxmemory",
        "connected_clients",
        "blocked_clients",
        "evicted_keys",
        "expired_keys",
        "keyspace_hits",
        "keyspace_misses",
        "total_commands_processed",
        "instantaneous_ops_per_sec",
        "total_connections_received",
        "rejected_connections",
    )
)


def merge_infos(infos: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One INFO for several servers (a cluster's masters): the counters of memory,
    clients, keys and commands summed (``used_memory``, ``maxmemory``, ...); ``*_status``
    fields ``ok`` only if every server's is; ``maxmemory_policy`` an evicting one if any
    server evicts; other numbers the smallest (``rdb_last_save_time``: the oldest save,
    ``aof_enabled``: on only if on everywhere); other text the first server's. Adds
    ``cluster_masters``, the number of servers merged."""
    rows = [dict(v) for _k, v in sorted(infos.items())]
    if not rows:
        return {}
    out: dict[str, Any] = dict(rows[0])
    for key in rows[0]:
        values = [r.get(key) for r in rows if key in r]
        if key in _SUMMED_INFO and all(isinstance(v, int | float) for v in values):
            out[key] = sum(values)
        elif key.endswith("_status"):
            out[key] = next((v for v in values if v != "ok"), "ok")
        elif key == "maxmemory_policy":
            out[key] = next((v for v in values if str(v) != "noeviction"), values[0])
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = min(v for v in values if v is not None)
    out["cluster_masters"] = len(rows)
    return out


def _waiting(client: Any, call: Any) -> Any:
    """``call()``, retried on :data:`CLUSTER_TRANSIENT` errors with exponential backoff
    (0.05 s doubling, at most 2 s apart) until the client's ``outage`` (default
    :data:`OUTAGE`) seconds have passed."""
    deadline: float | None = None
    pause = 0.05
    while True:
        try:
            return call()
        except _NOT_TRANSIENT:
            raise
        except CLUSTER_TRANSIENT as exc:
            now = time.monotonic()
            if deadline is None:
                deadline = now + getattr(client, "outage", OUTAGE)
            if now >= deadline:
                raise
            log.debug("Redis Cluster: %s; retrying in %.2f s", exc, pause)
            time.sleep(min(pause, max(deadline - now, 0.0)))
            pause = min(pause * 2, 2.0)
            with contextlib.suppress(*CLUSTER_TRANSIENT, redis.exceptions.RedisClusterException):
                client.nodes_manager.initialize()


PROBE_TIMEOUT = 3.0
"""Seconds the cluster check waits for one master's ``CLUSTER INFO`` (a hung master,
SIGSTOPped or swapping, must not hold up the check for the client's socket timeout)."""


def _probe(node: ClusterNode, timeout: float) -> redis.Redis:
    """A one-off client of ``node`` with its connection settings (password, TLS) but a
    ``timeout`` for connecting and for each reply, and no retry."""
    pool = node.redis_connection.connection_pool
    kwargs = {
        **pool.connection_kwargs,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    return redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    )


def _answering(
    plain: str, nodes: list[tuple[str, int]], timeout: float = PROBE_TIMEOUT
) -> list[tuple[str, int]]:
    """The nodes that answer a ``PING`` within ``timeout`` seconds (all asked at once; an
    error reply, a refused login included, is an answer)."""
    parse: Any = redis.connection.parse_url
    options: dict[str, Any] = parse(plain)

    def answers(node: tuple[str, int]) -> bool:
        pool = redis.ConnectionPool(
            **{
                **options,
                "host": node[0],
                "port": node[1],
                "socket_timeout": timeout,
                "socket_connect_timeout": timeout,
                "retry": Retry(NoBackoff(), 0),
            }
        )
        try:
            redis.Redis(connection_pool=pool).ping()
        except redis.exceptions.AuthenticationError:
            return True
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return False
        except redis.exceptions.RedisError:
            return True
        finally:
            pool.disconnect()
        return True

    with ThreadPoolExecutor(len(nodes)) as pool:
        return [node for node, ok in zip(nodes, pool.map(answers, nodes), strict=True) if ok]


def cluster_state(client: ClusterClient, timeout: float = PROBE_TIMEOUT) -> str:
    """``cluster_state`` as the masters see it: the first that is not ``ok`` (a master
    whose slots were taken from it says ``fail`` while the others still map them to it;
    the others say ``fail`` once a master stopped answering for cluster-node-timeout),
    else ``ok``. Each master gets ``timeout`` seconds to answer; one that does not is
    skipped (the cluster may serve without it: its replica takes over); when none
    answers, the last connection error."""

    def state_of(node: ClusterNode) -> str | redis.exceptions.RedisError:
        probe = _probe(node, timeout)
        try:
            info: Any = probe.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
            return str(info.get("cluster_state"))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            return exc
        finally:
            probe.close()
            probe.connection_pool.disconnect()

    masters = client.masters()
    with ThreadPoolExecutor(max(len(masters), 1)) as pool:  # (all at once: one timeout)
        states = list(pool.map(state_of, masters))
    answered = [x for x in states if isinstance(x, str)]
    if not answered and states:
        raise cast(redis.exceptions.RedisError, states[-1])
    return next((x for x in answered if x != "ok"), "ok")


def connect_cluster(
    settings: Settings, url: str, *, check: bool = True, **overrides: Any
) -> ClusterClient:
    """A :class:`ClusterClient` for the cluster URL ``url`` (every node it names is a
    startup node). :class:`ConfigError` for a malformed URL or a server that is not a
    cluster node, :class:`RedisUnavailable` when no node answers. ``check`` also asks
    the cluster for ``cluster_state:ok``."""
    check_userinfo(url)
    plain, nodes = cluster_nodes(url)
    if settings.redis_db not in (None, 0):
        raise ConfigError(
            "REDCRAWL_REDIS_URL",
            f"a Redis Cluster has only database 0, and REDIS_DB is {settings.redis_db}; "
            "unset REDIS_DB",
        )
    params: dict[str, Any] = {
        # retries within one command: quick ones (a MOVED, a node restarting); the
        # ClusterClient waits out longer trouble with backoff
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_keepalive": True,
        "socket_connect_timeout": 10,
        **{k: v for k, v in settings.redis_params.items() if k not in ("db", "retry")},
        **overrides,
    }
    if check:
        refuse_tls_at_plain(url, nodes[0])
        # discovery asks the startup nodes in a random order, each with the full socket
        # timeout: a hung one (SIGSTOP, swapping) would hold up the start for 30 s
        answering = _answering(plain, nodes)
        if answering and len(answering) < len(nodes):
            plain, _ = cluster_nodes(url, answering[0])
            nodes = answering
    node: Any = ClusterNode
    startup = [node(host, port) for host, port in nodes[1:]]
    try:
        client = ClusterClient(url=plain, startup_nodes=startup, **params)
    except redis.exceptions.AuthenticationError as exc:
        raise login_refused(url, exc) from None
    except ValueError as exc:
        raise ConfigError("REDCRAWL_REDIS_URL", f"{redact(url)}: {scrub(str(exc), url)}") from None
    except redis.exceptions.RedisClusterException as exc:
        if "not enabled" in str(exc):
            raise ConfigError(
                "REDCRAWL_REDIS_URL",
                f"{redact(url)}: the server is not a Redis Cluster node ({exc}); use "
                "redis:// (or rediss://) for a single server",
            ) from None
        raise RedisUnavailable(redact(url), exc, fix=_tls_fix(url, exc)) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise RedisUnavailable(redact(url), exc, fix=_tls_fix(url, exc)) from None
    if check:
        try:
            state = cluster_state(client)
        except redis.exceptions.ResponseError:  # e.g. an ACL user without CLUSTER INFO
            state = "ok"
        except redis.exceptions.RedisError as exc:
            client.close()
            raise RedisUnavailable(redact(url), exc) from None
        if state != "ok":
            client.close()
            raise RedisUnavailable(
                redact(url),
                f"cluster_state is {state!r}, not 'ok'",
                problem="the Redis Cluster answers but does not serve every slot",
                fix="A master and its replicas may be down, or slots unassigned: look with "
                f"`redis-cli -c -u {shlex.quote(redact(plain))} cluster nodes`, bring the "
                "nodes back (or `redis-cli --cluster fix`), then run this again.",
            )
    return client
