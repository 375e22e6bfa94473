"""WSGI middleware (Flask, Django, any WSGI app): :class:`RateLimitMiddleware`.

::

    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, client=client, limit=5, period_ms=10_000)

The same answers and headers as :mod:`ringlimit.asgi`: a denied request gets ``429`` with
``Retry-After``, both it and an admitted one carry ``X-RateLimit-*``, ``RateLimit-Policy`` and
``RateLimit``. The key is ``REMOTE_ADDR`` unless ``key`` (a function of the WSGI environ) says
otherwise.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from ._middleware import Limit, denied_body, error_response
from ._rules import Inline
from .errors import RingLimitError

Environ = Dict[str, Any]
KeyFn = Callable[[Environ], Optional[str]]

_REASONS = {429: "429 Too Many Requests", 500: "500 Internal Server Error", 503: "503 Service Unavailable"}


def client_ip(environ: Environ) -> Optional[str]:
    """The peer's address (the default key)."""
    return environ.get("REMOTE_ADDR") or None


def header(name: str) -> KeyFn:
    """A key function: the value of request header ``name`` (absent or empty: not limited)."""
    wanted = "HTTP_" + name.upper().replace("-", "_")

    def key(environ: Environ) -> Optional[str]:
        return environ.get(wanted) or None

    return key


class RateLimitMiddleware:
    """Rate-limits a WSGI app with a :class:`ringlimit.Client`."""

    def __init__(
        self,
        app: Callable[..., Iterable[bytes]],
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

    def __call__(self, environ: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        k = self.key(environ)
        if not k:
            return self.app(environ, start_response)
        lim = self.limit
        try:
            answer = self.client.check(k, rule=lim.rule, limit=lim.limit, period_ms=lim.period_ms, cost=lim.cost)
        except RingLimitError as err:
            status, headers, body = error_response(err)
            start_response(_REASONS[status], headers + [("Content-Length", str(len(body)))])
            return [body]
        extra = lim.headers(self.client, answer)
        if not answer.allowed:
            body = denied_body(answer)
            headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))] + extra
            start_response(_REASONS[429], headers)
            return [body]

        def start_with_headers(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, list(headers) + extra, exc_info)

        return self.app(environ, start_with_headers)
