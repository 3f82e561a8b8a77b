"""A cap on request bodies: an ASGI middleware that answers 413 once a body is known to be
over ``limit`` bytes: at once by ``Content-Length``, else when the app reads past the
limit. The body is read only when the app asks for it (after the token is checked), so an
unauthenticated call costs no body read at all."""

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["BodyLimit", "BodyTooLarge"]


class BodyTooLarge(Exception):
    """Raised into the app when it reads more than the limit; answered with 413."""


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413 and redcrawl's error shape. The app reads
    the whole body before it parses any of it, so nothing of a refused call is stored."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send, int(declared))
            return
        size = 0
        started = False

        async def counted() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > self.limit:
                    raise BodyTooLarge
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:
            if started:
                raise
            await self._refuse(send, None)

    async def _refuse(self, send: Send, declared: int | None) -> None:
        size = f"{declared} bytes" if declared is not None else "more than that"
        detail = (
            f"request body too large: {size}, the limit is {self.limit} bytes "
            "(REDCRAWL_API_MAX_BODY); nothing was stored: split the batch into "
            "smaller calls"
        )
        payload = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
