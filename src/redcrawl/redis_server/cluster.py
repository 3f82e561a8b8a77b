"""A throwaway Redis Cluster on loopback for tests and benchmarks (part of
:mod:`redcrawl.redis_server`): :class:`LocalCluster`, its nodes :class:`RedisServer`."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from redcrawl.redis_server.binary import cli_binary, find_binary, free_ports
from redcrawl.redis_server.process import RedisServer

__all__ = ["LocalCluster"]


class LocalCluster:
    """A throwaway Redis Cluster on loopback: ``masters`` masters with ``replicas`` replicas
    each (``redis-server --cluster-enabled yes``, joined by ``redis-cli --cluster create``),
    ready once every node reports ``cluster_state:ok`` and sees every slot covered.

    ``node_timeout`` (ms) is the cluster's ``cluster-node-timeout``: how long a master may
    be silent before its replica is promoted. :meth:`stop` kills every node (by pid) and
    removes the data folder when none was given. Each node is a :class:`RedisServer`
    (:attr:`nodes`, in creation order: the masters first, as ``--cluster create`` assigns
    them).
    """

    def __init__(
        self,
        binary: str | None = None,
        directory: Path | str | None = None,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout: int = 2000,
        cli: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        found = binary or find_binary("7") or find_binary()
        if found is None:
            raise RuntimeError("no redis-server found: install Debian's redis-server")
        cli = cli or cli_binary(found)
        if cli is None:
            raise RuntimeError("no redis-cli found: install Debian's redis-tools")
        self.binary, self.cli = found, cli
        self._own_dir = directory is None
        self.directory = Path(
            directory if directory is not None else tempfile.mkdtemp(prefix="redcrawl-cluster-")
        )
        self.node_timeout = node_timeout
        self.nodes: list[RedisServer] = []
        try:
            for i in range((1 + replicas) * masters):
                self.nodes.append(self._node(found, i, node_timeout))
            create = [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
            subprocess.run(
                [*create, "--cluster-replicas", str(replicas), "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=timeout,
            )
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """``redis+cluster://`` URL naming every node (redcrawl's cluster URL)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def live(self) -> list[RedisServer]:
        """The nodes whose process is running."""
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every live node reports ``cluster_state:ok`` with all 16384 slots
        assigned and ok (after a failover: the replica was promoted everywhere), and every
        live replica's link to its master is up (a replica that never synced would not
        take over)."""
        deadline = time.monotonic() + timeout
        while True:
            if all(_cluster_ok(n) and _replica_ok(n) for n in self.live()):
                return
            if time.monotonic() > deadline:
                states = {n.port: _cluster_info(n).get("cluster_state") for n in self.live()}
                raise RuntimeError(f"the cluster is not ok after {timeout} s: {states}")
            time.sleep(0.05)

    def masters(self) -> list[RedisServer]:
        """The live nodes that are masters now."""
        return [n for n in self.live() if _role(n) == "master"]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        """The live replicas of ``master``."""
        out = []
        for n in self.live():
            try:
                with n.client(socket_timeout=2, retry=Retry(NoBackoff(), 0)) as c:
                    info = c.info("replication")
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                continue
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
                out.append(n)
        return out

    def master_of(self, key: str) -> RedisServer:
        """The live master serving ``key``'s slot."""
        with self.masters()[0].client() as c:
            slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
        for n in self.masters():
            with n.client() as c:
                for start, end, *_ in c.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end and int(_[0][1]) == n.port:
                        return n
        raise RuntimeError(f"no live master serves {key!r}")

    def _node(self, binary: str, i: int, node_timeout: int) -> RedisServer:
        """Start node ``i`` on free ports, trying other ports twice more if it can't bind
        (a port free a moment ago may have been taken since)."""
        for attempt in range(3):
            port, bus = free_ports(2)
            extra = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(node_timeout),
                # the bus port, given: the default (port + 10000) may not exist
                "--cluster-port",
                str(bus),
                # a replica's first sync at once (Redis 7 waits 5 s by default): a
                # replica that never synced refuses to take over
                "--repl-diskless-sync-delay",
                "0",
                "--logfile",
                str(self.directory / f"n{i}" / "redis.log"),
            ]
            try:
                return RedisServer(binary, self.directory / f"n{i}", port=port, extra=extra)
            except RuntimeError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Kill every node and remove the temporary folder. Harmless when called again."""
        for n in self.nodes:
            n.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _cluster_info(node: RedisServer) -> dict[str, str]:
    try:
        with node.client(socket_timeout=2, retry=Retry(NoBackoff(), 0)) as c:
            text = c.execute_command("CLUSTER", "INFO")
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return {}
    if isinstance(text, bytes):
        text = text.decode()
    return dict(line.split(":", 1) for line in str(text).splitlines() if ":" in line)


def _cluster_ok(node: RedisServer) -> bool:
    info = _cluster_info(node)
    return info.get("cluster_state") == "ok" and info.get("cluster_slots_ok") == "16384"


def _replica_ok(node: RedisServer) -> bool:
    """A master whose replicas are all ``online`` (after a replica's first sync, a master
    streams its writes to it only once the replica has acknowledged, up to a second
    later: a master dying before that loses every write since), or a replica whose link
    to its live master is up (a replica of a dead master counts as ok)."""
    try:
        with node.client(socket_timeout=2, retry=Retry(NoBackoff(), 0)) as c:
            info = c.info("replication")
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False
    if info.get("role") == "master":
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return not replicas or _streams_to_replicas(node, len(replicas))
    if info.get("master_link_status") == "up":
        return True
    port = int(info.get("master_port", 0))
    try:
        with redis.Redis(port=port, socket_timeout=1, retry=Retry(NoBackoff(), 0)) as master:
            master.ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return True  # its master is gone
    return False


def _streams_to_replicas(node: RedisServer, replicas: int) -> bool:
    """Whether a write on master ``node`` reaches its ``replicas`` (``WAIT``): a key of one
    of its slots is written, waited for, and deleted."""
    try:
        with node.client(socket_timeout=2, retry=Retry(NoBackoff(), 0)) as c:
            own = [(int(a), int(b)) for a, b, m, *_ in c.execute_command("CLUSTER", "SLOTS")
                   if int(m[1]) == node.port]  # fmt: skip
            key = next(
                k
                for k in (f"redcrawl:probe:{{{i}}}" for i in range(100_000))
                if any(a <= key_slot(k.encode()) <= b for a, b in own)
            )
            c.set(key, 1)
            acked = int(c.execute_command("WAIT", replicas, 200))
            c.delete(key)
            return acked >= replicas
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, StopIteration):
        return False


def _role(node: RedisServer) -> str:
    try:
        with node.client(socket_timeout=2, retry=Retry(NoBackoff(), 0)) as c:
            return str(c.info("replication").get("role", ""))
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return ""
