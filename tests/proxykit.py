"""A reply-dropping TCP proxy in front of a real Redis (lost replies made real), and the
small helpers the lost-reply tests share. The ``dropper`` fixture is in conftest.py."""

from __future__ import annotations

import contextlib
import socket
import threading

import redis

from redcrawl.codec import Envelope
from redcrawl.connection import connect
from redcrawl.frontier import FrontierCore
from redcrawl.frontier.base import parse_id
from redcrawl.settings import Settings

__all__ = ["ReplyDropper", "envs", "held"]


class ReplyDropper:
    """A loopback TCP proxy to a Redis server. After :meth:`arm`, the reply to the next
    script call (EVALSHA) is not forwarded: both sides of that connection are closed
    instead, after the server ran the call."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._armed = threading.Event()  # waiting for an EVALSHA to go out
        self._drop = threading.Event()  # its reply is the next to come back
        self.dropped = 0
        self._socks: list[socket.socket] = []
        self._clients: list[redis.Redis] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def client(self, settings: Settings) -> redis.Redis:
        """A redcrawl client (retrying, as workers have) through the proxy."""
        client = connect(settings, url=self.url)
        self._clients.append(client)
        return client

    def arm(self) -> None:
        self._armed.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._socks += (client, server)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                if not replies and self._armed.is_set() and b"EVALSHA" in data:
                    self._armed.clear()
                    self._drop.set()  # (not a health-check PING's reply, say)
                elif replies and self._drop.is_set():
                    self._drop.clear()
                    self.dropped += 1
                    break  # the script ran; its reply never reaches the client
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self.listener.close()
        for s in self._socks:
            s.close()


def envs(n: int, start: int = 0, *, dont_filter: bool = False) -> list[Envelope]:
    return [
        Envelope(
            url=f"http://h{i % 3}.example/{i}",
            fingerprint=i.to_bytes(20, "big"),
            dont_filter=dont_filter,
        )
        for i in range(start, start + n)
    ]


def held(f: FrontierCore) -> set[bytes]:
    return {parse_id(info.id) for info in f.inflight(limit=1000)}
