"""Middleware (ASGI with FastAPI/Starlette's TestClient, WSGI with Flask's test client) and
the headers they write, with a fake client: the same fields as the node's HTTP edge."""

from __future__ import annotations

import time
from typing import Any, List, Optional

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import guarded_flask
import guarded_service
from ringlimit import Answer, Inline, InvalidCheck, Unavailable
from ringlimit.asgi import RateLimitMiddleware
from ringlimit.headers import headers_for, ietf_values, rate_headers, retry_after_secs, sf_string


def a(allowed: bool, limit: int, remaining: int, reset_at_ms: int, retry_after_ms: int = 0) -> Answer:
    return Answer(allowed, limit, remaining, reset_at_ms, retry_after_ms)


def test_ietf_fields_list_every_limit_as_structured_fields() -> None:
    now_ms = 1_700_000_000_000
    first = a(True, 100, 42, 1_700_000_018_000)
    second = a(True, 5, 0, 1_700_000_000_250)
    policy, state = ietf_values([("per-user", 60_000, first), ('odd"name', 250, second)], now_ms)
    assert policy == '"per-user";q=100;w=60, "odd\\"name";q=5;w=1'
    assert state == '"per-user";r=42;t=18, "odd\\"name";r=0;t=1'
    assert sf_string("a\\b\u00e9") == '"a\\\\b"'


def test_headers_round_up_to_whole_seconds() -> None:
    denied = a(False, 10, 0, 1_700_000_000_001, 1)
    assert rate_headers(denied) == [
        ("X-RateLimit-Limit", "10"),
        ("X-RateLimit-Remaining", "0"),
        ("X-RateLimit-Reset", "1700000001"),
    ]
    assert retry_after_secs(denied) == 1
    assert retry_after_secs(a(False, 10, 0, 0, 0)) == 1
    assert retry_after_secs(a(False, 10, 0, 0, 2001)) == 3
    # A limit never learnt (no node reached yet): no numbers to report.
    assert headers_for([("api", 0, a(True, 0, 0, 0))], a(True, 0, 0, 0)) == []


class FakeClient:
    """Answers from a script; counts what it was asked."""

    def __init__(self, answers: List[Any], period: Optional[int] = 60_000) -> None:
        self.answers = answers
        self.asked: List[tuple] = []
        self.period = period

    def check(self, key: str, rule: Any = None, limit: Any = None, period_ms: Any = None, cost: int = 1) -> Answer:
        self.asked.append((key, rule, limit, period_ms, cost))
        got = self.answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    def period_ms(self, rule: Any) -> Optional[int]:
        return self.period


class AsyncFakeClient(FakeClient):
    async def check(self, key: str, rule: Any = None, limit: Any = None, period_ms: Any = None, cost: int = 1) -> Answer:  # type: ignore[override]
        return FakeClient.check(self, key, rule, limit, period_ms, cost)


def reset_in(ms: int) -> int:
    return -(-time.time_ns() // 1_000_000) + ms


@pytest.mark.parametrize("make", [FakeClient, AsyncFakeClient])
def test_the_example_service_admits_five_then_429_with_the_nodes_headers(make: Any) -> None:
    answers: List[Any] = [a(True, 5, 4 - i, reset_in(2_000 * (i + 1))) for i in range(5)]
    answers.append(a(False, 5, 0, reset_in(10_000), 1_500))
    fake = make(answers)
    http = TestClient(guarded_service.build(fake))
    for i in range(5):
        r = http.get("/hello", headers={"x-api-key": "alice"})
        assert r.status_code == 200 and r.text == "hello, alice\n"
        assert r.headers["x-ratelimit-limit"] == "5"
        assert r.headers["x-ratelimit-remaining"] == str(4 - i)
        assert r.headers["ratelimit-policy"] == '"5-per-10000ms";q=5;w=10'
        assert r.headers["ratelimit"] in (f'"5-per-10000ms";r={4 - i};t={2 * (i + 1)}', f'"5-per-10000ms";r={4 - i};t={2 * (i + 1) - 1}')
        assert "retry-after" not in r.headers
    r = http.get("/hello", headers={"x-api-key": "alice"})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "2", "1.5 s rounded up"
    assert r.json() == {"error": "rate_limited", "message": "Too many requests; retry after 2 s."}
    assert r.headers["ratelimit"].startswith('"5-per-10000ms";r=0;t=')
    assert fake.asked[0] == ("alice", None, 5, 10_000, 1)
    # No key: not limited, the app answers (and nobody is asked).
    r = http.get("/hello")
    assert r.status_code == 401 and len(fake.asked) == 6


def test_asgi_keys_by_client_ip_by_default_and_names_a_rule() -> None:
    fake = FakeClient([a(True, 100, 99, reset_in(600))], period=60_000)
    app = FastAPI()

    @app.get("/")
    def root() -> dict:
        return {"ok": True}

    app.add_middleware(RateLimitMiddleware, client=fake, rule="default")
    r = TestClient(app).get("/")
    assert r.status_code == 200
    assert fake.asked == [("testclient", "default", None, None, 1)]
    assert r.headers["ratelimit-policy"] == '"default";q=100;w=60'


def test_asgi_a_misconfigured_limit_is_a_500_and_a_closed_cluster_a_503() -> None:
    fake = FakeClient([InvalidCheck("unknown_rule", "no rule named 'x'"), Unavailable("unavailable", "owner unreachable")])
    app = FastAPI()

    @app.get("/")
    def root() -> dict:
        return {}

    app.add_middleware(RateLimitMiddleware, client=fake, rule="x")
    http = TestClient(app)
    r = http.get("/")
    assert r.status_code == 500 and r.json()["error"] == "rate_limit_misconfigured"
    r = http.get("/")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"


def test_flask_admits_then_denies_with_the_same_headers() -> None:
    fake = FakeClient([a(True, 5, 0, reset_in(2_000)), a(False, 5, 0, reset_in(2_000), 2_000)])
    http = guarded_flask.build(fake).test_client()
    r = http.get("/hello", headers={"x-api-key": "bob"})
    assert r.status_code == 200 and r.text == "hello, bob\n"
    assert r.headers["RateLimit-Policy"] == '"5-per-10000ms";q=5;w=10'
    assert r.headers["X-RateLimit-Remaining"] == "0"
    r = http.get("/hello", headers={"x-api-key": "bob"})
    assert r.status_code == 429 and r.headers["Retry-After"] == "2"
    assert r.json["error"] == "rate_limited"
    assert fake.asked[0] == ("bob", None, 5, 10_000, 1)
    r = http.get("/hello")
    assert r.status_code == 401


def test_an_inline_rule_object_is_named_by_its_parameters() -> None:
    fake = FakeClient([a(True, 10, 9, reset_in(1_000))])
    app = FastAPI()

    @app.get("/")
    def root() -> dict:
        return {}

    app.add_middleware(RateLimitMiddleware, client=fake, rule=Inline(10, 1_000, "sliding_log"))
    r = TestClient(app).get("/")
    assert r.headers["ratelimit-policy"] == '"10-per-1000ms-sliding_log";q=10;w=1'
