"""A FastAPI service whose ``GET /hello`` is limited per ``x-api-key`` header at 5 requests per
10 s (token bucket) through a ringlimit cluster: the Python twin of the Rust SDK's
``guarded_service`` example.

    pip install "ringlimit[test]" uvicorn
    RINGLIMIT_SEEDS=http://127.0.0.1:8080 uvicorn guarded_service:app --port 3000
    curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/hello

The client credential, if the nodes ask for one, comes from ``RINGLIMIT_CLIENT_TOKEN``.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from fastapi import FastAPI, Header
from fastapi.responses import PlainTextResponse

import ringlimit.aio
from ringlimit.asgi import RateLimitMiddleware, header

#: 5 requests per 10 s per API key.
HELLO_LIMIT = 5
HELLO_PERIOD_MS = 10_000


def build(client: Any) -> FastAPI:
    """The app, limited by ``client`` (a ringlimit client, or a test's stand-in)."""
    app = FastAPI()

    @app.get("/hello", response_class=PlainTextResponse)
    async def hello(x_api_key: Optional[str] = Header(default=None)) -> PlainTextResponse:
        if not x_api_key:
            return PlainTextResponse("an x-api-key header is required\n", status_code=401)
        return PlainTextResponse(f"hello, {x_api_key}\n")

    app.add_middleware(
        RateLimitMiddleware,
        client=client,
        limit=HELLO_LIMIT,
        period_ms=HELLO_PERIOD_MS,
        key=header("x-api-key"),
    )
    return app


def _from_env() -> FastAPI:
    seeds = os.environ.get("RINGLIMIT_SEEDS", "http://127.0.0.1:8080").split(",")
    client = ringlimit.aio.Client(seeds, token=os.environ.get("RINGLIMIT_CLIENT_TOKEN"))
    return build(client)


if os.environ.get("RINGLIMIT_SEEDS"):
    app = _from_env()
