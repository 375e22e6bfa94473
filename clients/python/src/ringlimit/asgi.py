"""ASGI middleware (Starlette, FastAPI, any ASGI app): :class:`RateLimitMiddleware`.

::

    app.add_middleware(RateLimitMiddleware, client=client, limit=5, period_ms=10_000)

A denied request gets ``429 Too Many Requests`` with ``Retry-After`` and never reaches the
app; both it and an admitted one carry ``X-RateLimit-*`` and the IETF ``RateLimit-Policy`` and
``RateLimit`` fields, as the node's HTTP API writes them. The key is the client's IP unless
``key`` says otherwise (a function of the ASGI scope; ``None``: the request is not limited).
"""

from __future__ import annotations

import inspect
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, Union

from ._middleware import Limit, denied_body, error_response
from ._rules import Inline
from .errors import RingLimitError

Scope = Dict[str, Any]
KeyFn = Callable[[Scope], Optional[str]]


def client_ip(scope: Scope) -> Optional[str]:
    """The peer's address (the default key)."""
    client = scope.get("client")
    return str(client[0]) if client else None


def header(name: str) -> KeyFn:
    """A key function: the value of request header ``name`` (absent or empty: not limited)."""
    wanted = name.lower().encode("latin-1")

    def key(scope: Scope) -> Optional[str]:
        for k, v in scope.get("headers") or []:
            if k.lower() == wanted and v:
                return v.decode("latin-1")
        return None

    return key


def _raw(headers: List[Tuple[str, str]]) -> List[Tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


class RateLimitMiddleware:
    """Rate-limits an ASGI app with a :class:`ringlimit.aio.Client` (or a
    :class:`ringlimit.Client`, whose checks then run on the event loop: a leased or local
    answer does not block, a round trip blocks it for at most its deadline)."""

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        client: Any,
        rule: Optional[Union[str, Inline]] = None,
        limit: Optional[int] = None,
        period_ms: Optional[int] = None,
        key: KeyFn = client_ip,
        cost: int = 1,
    ) -> None:
        self.app = app
        self.client = client
        self.limit = Limit(rule, limit, period_ms, cost)
        self.key = key
        self._async = inspect.iscoroutinefunction(client.check)

    async def __call__(self, scope: Scope, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        k = self.key(scope)
        if not k:
            await self.app(scope, receive, send)
            return
        lim = self.limit
        try:
            got = self.client.check(k, rule=lim.rule, limit=lim.limit, period_ms=lim.period_ms, cost=lim.cost)
            answer = await got if self._async else got
        except RingLimitError as err:
            status, headers, body = error_response(err)
            await _respond(send, status, headers, body)
            return
        extra = _raw(lim.headers(self.client, answer))
        if not answer.allowed:
            await _respond_raw(send, 429, [(b"content-type", b"application/json")] + extra, denied_body(answer))
            return

        async def send_with_headers(message: Dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers") or []) + extra
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _respond(send: Callable[..., Any], status: int, headers: List[Tuple[str, str]], body: bytes) -> None:
    await _respond_raw(send, status, _raw(headers), body)


async def _respond_raw(send: Callable[..., Any], status: int, headers: List[Tuple[bytes, bytes]], body: bytes) -> None:
    headers = headers + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
