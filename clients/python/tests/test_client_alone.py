"""A client whose cluster never answers (its seed a loopback port just closed): every check is
the client's alone, its fallback, its fail mode, its validation."""

from __future__ import annotations

import asyncio

import pytest

import ringlimit
import ringlimit.aio
from ringlimit import Check, Inline, InvalidCheck, Unavailable, UnknownRule
from cluster import free_port

HOUR = 3_600_000


def unreachable(**settings) -> ringlimit.Client:
    return ringlimit.Client([f"http://127.0.0.1:{free_port()}"], discovery_timeout_ms=200, **settings)


def test_settings_that_cannot_work_are_refused() -> None:
    for bad in ([], ["host"], ["http://h:1/v1"], ["https://h:1/v1"], ["ftp://h:1"]):
        with pytest.raises(ValueError):
            ringlimit.Client(bad)
    with pytest.raises(ValueError):
        ringlimit.Client(["http://127.0.0.1:1"], deadline_ms=0)
    with pytest.raises(ValueError):
        ringlimit.Client(["http://127.0.0.1:1"], fallback_fraction=1.5)


def test_tls_settings_that_cannot_work_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="mix http:// and https://"):
        ringlimit.Client(["http://127.0.0.1:1", "https://127.0.0.1:2"])
    with pytest.raises(ValueError, match="plaintext"):
        ringlimit.Client(["http://127.0.0.1:1"], tls_ca=b"-----BEGIN CERTIFICATE-----")
    with pytest.raises(ValueError, match="plaintext"):
        ringlimit.aio.Client(["http://127.0.0.1:1"], tls_server_name="ringlimit.test")
    with pytest.raises(ValueError, match="cannot read"):
        ringlimit.Client(["https://127.0.0.1:1"], tls_ca=str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="no PEM certificate"):
        ringlimit.Client(["https://127.0.0.1:1"], tls_ca=tmp_path / "junk.pem")
    # No client certificate: the nodes ask for none on their HTTP and gRPC ports.
    with pytest.raises(TypeError):
        ringlimit.Client(["https://127.0.0.1:1"], tls_cert="c.pem", tls_key="k.pem")


def test_an_unreachable_tls_seed_is_degraded() -> None:
    # https:// alone: the system's roots; nothing answers there, so the fallback decides.
    with ringlimit.Client([f"https://127.0.0.1:{free_port()}"], discovery_timeout_ms=200) as client:
        a = client.check("k", limit=1, period_ms=HOUR)
        assert a.allowed and a.degraded


def test_without_a_member_inline_limits_hold_on_the_fallback() -> None:
    with unreachable() as client:
        assert client.members() == []
        answers = [client.check("k", limit=3, period_ms=HOUR) for _ in range(4)]
        assert [x.allowed for x in answers] == [True, True, True, False]
        assert all(x.degraded and not x.leased and x.limit == 3 for x in answers)
        s = client.stats()
        assert (s["degraded"], s["direct"], s["checks_sent"]) == (4, 0, 0)


def test_a_named_rule_never_learnt_is_admitted_without_a_limit() -> None:
    with unreachable() as client:
        a = client.check("k", rule="api")
        assert a.allowed and a.degraded and a.limit == 0
        assert client.period_ms("api") is None
        assert client.period_ms((5, 10_000)) == 10_000


def test_fail_closed_without_a_member_is_unavailable() -> None:
    with unreachable(fail_open=False) as client:
        with pytest.raises(Unavailable):
            client.check("k", limit=3, period_ms=HOUR)


def test_bad_checks_raise_typed_errors_with_the_nodes_codes() -> None:
    with unreachable() as client:
        cases = [
            (dict(key="", limit=1, period_ms=1), "invalid_key"),
            (dict(key="k" * 513, limit=1, period_ms=1), "invalid_key"),
            (dict(key="k", limit=0, period_ms=1_000), "invalid_limit"),
            (dict(key="k", limit=1, period_ms=0), "invalid_period"),
            (dict(key="k", limit=5, period_ms=1_000, cost=6), "invalid_cost"),
            (dict(key="k", rule=Inline(5, 1_000, "fixed_window", burst=3)), "invalid_burst"),
            (dict(key="k", rule=Inline(5, 1_000, "no_such")), "unknown_algorithm"),
            (dict(key="k"), "invalid_request"),
            (dict(key="k", rule="api", limit=1, period_ms=1), "invalid_request"),
        ]
        for kwargs, code in cases:
            with pytest.raises(InvalidCheck) as e:
                client.check(**kwargs)
            assert e.value.code == code, kwargs
        assert client.stats()["fallback_buckets"] == 0, "a bad check takes nothing"


def test_check_all_on_the_fallback_is_all_or_nothing() -> None:
    with unreachable() as client:
        ip = Check("ip:1", limit=10, period_ms=HOUR)
        user = Check("user:1", limit=1, period_ms=HOUR)
        first = client.check_all([ip, user])
        assert first.allowed and first.degraded and first.binding == 1
        second = client.check_all([ip, user])
        assert not second.allowed and second.binding == 1
        assert second.results[0].allowed and second.results[0].remaining == 9, "given back"
        assert client.check("ip:1", limit=10, period_ms=HOUR, cost=0).remaining == 9
        with pytest.raises(InvalidCheck) as e:
            client.check_all([])
        assert e.value.code == "invalid_batch"
        with pytest.raises(InvalidCheck) as e:
            client.check_all([ip, ip])
        assert e.value.code == "duplicate_check"
        with pytest.raises(InvalidCheck) as e:
            client.check_all([ip, {"key": "", "limit": 1, "period_ms": 1}])
        assert e.value.code == "invalid_key" and "check 1" in e.value.message


def test_reservations_never_fall_back() -> None:
    with unreachable() as client:
        with pytest.raises(Unavailable):
            client.reserve("k", limit=100, period_ms=HOUR, estimate=10)
        with pytest.raises(InvalidCheck):
            client.reserve("k", limit=100, period_ms=HOUR, estimate=101)


def test_the_async_client_answers_alike() -> None:
    async def run() -> None:
        client = ringlimit.aio.Client([f"http://127.0.0.1:{free_port()}"], discovery_timeout_ms=200)
        try:
            assert not await client.ready(0.5)
            got = [await client.check("k", limit=2, period_ms=HOUR) for _ in range(3)]
            assert [x.allowed for x in got] == [True, True, False] and all(x.degraded for x in got)
            with pytest.raises(InvalidCheck):
                await client.check("", limit=2, period_ms=HOUR)
            all_ = await client.check_all([Check("a", limit=1, period_ms=HOUR)])
            assert all_.allowed
        finally:
            await client.close()

    asyncio.run(run())
