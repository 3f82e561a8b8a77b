"""Trial 3's review of the connection errors that name their fix: the advice must match
what went wrong (a real redis-server; a port nothing listens on)."""

from __future__ import annotations

import socket

import pytest
import redis

from redcrawl.connection import connect, login_refused
from redcrawl.errors import RedisUnavailable
from redcrawl.settings import Settings

from .conftest import RedisServer


def _refused(url: str) -> str:
    with pytest.raises(RedisUnavailable) as caught:
        connect(Settings(redis_url=url))
    return str(caught.value)


def test_a_password_for_a_server_without_one_says_to_remove_it(
    redis7_client: redis.Redis,
) -> None:
    """The URL gives a password, the server has none configured: its reply to AUTH is
    "AUTH <password> called without any password configured" (redis-py 8 ignores it at
    connect, older ones and other clients raise it). Seen before: "Redis refused the user
    name or password" and advice to put the password in the URL."""
    with pytest.raises(redis.exceptions.AuthenticationError) as caught:
        redis7_client.execute_command("AUTH", "some-pw")
    message = str(login_refused("redis://:some-pw@127.0.0.1:6379/0", caught.value))
    assert "no password" in message and "remove" in message.lower(), message
    assert "some-pw" not in message, message


def test_rediss_to_a_port_nothing_listens_on_gives_no_tls_advice() -> None:
    """rediss:// to a port nothing listens on (connection refused): the advice is the
    usual one (is the server running?), not TLS's. Seen before: "The URL asks for TLS
    (rediss://): if the server does not use TLS, write redis://" for any failure."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    message = _refused(f"rediss://127.0.0.1:{port}/0")
    assert "TLS" not in message, message
    assert RedisUnavailable.DEFAULT_FIX in message, message


def test_rediss_at_a_server_without_tls_is_told_at_once(redis7: RedisServer) -> None:
    """A TLS URL at a plain server: the server answers a plain PING, so the error says it
    does not use TLS and to write redis:// (the TLS handshake alone only timed out: 6 s
    here, 32 to 90 s on a cluster, and "Timeout connecting to server")."""
    message = _refused(redis7.url.replace("redis://", "rediss://"))
    assert "the server does not use TLS" in message, message
    assert "write redis:// instead" in message, message
