"""The same ``GET /hello`` (5 requests per 10 s per ``x-api-key``) as a Flask (WSGI) app.

    RINGLIMIT_SEEDS=http://127.0.0.1:8080 flask --app guarded_flask run --port 3000
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, request

import ringlimit
from ringlimit.wsgi import RateLimitMiddleware, header


def build(client: Any) -> Flask:
    app = Flask(__name__)

    @app.get("/hello")
    def hello() -> Any:
        key = request.headers.get("x-api-key")
        if not key:
            return "an x-api-key header is required\n", 401
        return f"hello, {key}\n"

    app.wsgi_app = RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, client=client, limit=5, period_ms=10_000, key=header("x-api-key")
    )
    return app


if os.environ.get("RINGLIMIT_SEEDS"):
    app = build(ringlimit.Client(os.environ["RINGLIMIT_SEEDS"].split(","), token=os.environ.get("RINGLIMIT_CLIENT_TOKEN")))
