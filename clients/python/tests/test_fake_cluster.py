"""The client against in-process fake nodes (``fake_node``): the topology over ``grpc://``
seeds and ``WatchTopology``, leases (asked, spent exactly, given back), holds given back by
``check_all``, the credential on every call. The fakes count plainly: what is tested is what
the client sends and how it spends what it is given."""

from __future__ import annotations

import asyncio
import time

import pytest

import ringlimit
import ringlimit.aio
from cluster import wait_for
from fake_node import FakeCluster, rule
from ringlimit import Check
from ringlimit.v1 import ratelimiter_pb2 as pb

# Hot keys promoted at 20 checks/s (1,000 by default): the tests do not depend on how fast
# this machine runs a thread of checks.
HOT_RATE = 20.0


@pytest.fixture
def fake():
    with FakeCluster(3, rules=[rule("hot", 5_000), rule("api", 10), rule("kept", 100_000, leasable=False)]) as f:
        yield f


def test_grpc_seeds_and_the_watch_keep_the_topology(fake: FakeCluster) -> None:
    with ringlimit.Client(fake.seeds, deadline_ms=2_000) as c:
        assert c.members() == ["f0", "f1", "f2"]
        wait_for("a watch", lambda: fake.calls("WatchTopology"))
        fake.shared.change(fake.shared.members[:2])
        wait_for("the change pushed", lambda: c.members() == ["f0", "f1"], within=5)
        # Every key now goes to f0 or f1, as the ring of two says.
        for i in range(30):
            assert c.owner_of(f"k{i}", rule="api") in ("f0", "f1")


def test_checks_carry_the_credential_and_batch_per_owner(fake: FakeCluster) -> None:
    with ringlimit.Client(fake.seeds, token="s3cret-token", deadline_ms=2_000) as c:
        assert c.check("user:1", rule="api").allowed
        assert set(fake.shared.metadata) == {"Bearer s3cret-token"}


def test_a_hot_key_is_leased_spent_exactly_and_given_back(fake: FakeCluster) -> None:
    with ringlimit.Client(fake.seeds, leases=True, hot_keys_rate=HOT_RATE, deadline_ms=2_000) as c:
        admitted = leased = 0
        end = time.monotonic() + 20
        while time.monotonic() < end and admitted < 5_000:
            a = c.check("hot:1", rule="hot")
            admitted += a.allowed
            leased += a.leased
        assert admitted == 5_000, "the whole limit, every token once"
        for _ in range(500):
            assert not c.check("hot:1", rule="hot").allowed, "never more than the limit"
        assert leased > 0 and fake.calls("Lease"), c.stats()
        asks = fake.calls("Lease")
        assert all(k == "hot:1" for _, _, keys in asks for k, _ in keys)
    # A fresh key leased, then the client closed: what its slice held goes back.
    with ringlimit.Client(fake.seeds, leases=True, hot_keys_rate=HOT_RATE, deadline_ms=2_000) as c:
        end = time.monotonic() + 20
        while time.monotonic() < end and not c.check("hot:2", rule="hot").leased:
            pass
        c.check("hot:2", rule="hot")
    backs = [item for _, _, items in fake.calls("GiveBack") for item in items if item[0] == "hot:2"]
    assert backs and all(tokens > 0 and mark == 7 for _, tokens, mark in backs)
    # Whatever went back is admissible again at the owner.
    with ringlimit.Client(fake.seeds, deadline_ms=2_000) as c:
        used = fake.shared.used[("rule:hot", "hot:2")]
        assert used < 5_000 and c.check("hot:2", rule="hot", cost=0).remaining == 5_000 - used


def test_a_rule_that_opts_out_is_never_leased(fake: FakeCluster) -> None:
    with ringlimit.Client(fake.seeds, leases=True, hot_keys_rate=HOT_RATE, deadline_ms=2_000) as c:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            assert not c.check("kept:1", rule="kept").leased
        assert not fake.calls("Lease")


def test_an_owner_that_keeps_its_bucket_sends_checks_to_it(fake: FakeCluster) -> None:
    fake.shared.leases_enabled = False
    with ringlimit.Client(fake.seeds, leases=True, hot_keys_rate=HOT_RATE, deadline_ms=2_000) as c:
        end = time.monotonic() + 10
        while time.monotonic() < end and not fake.calls("Lease"):
            c.check("hot:3", rule="hot")
        assert fake.calls("Lease"), "hot enough to ask"
        n = len(fake.calls("Lease"))
        for _ in range(100):
            assert not c.check("hot:3", rule="hot").leased
        assert len(fake.calls("Lease")) <= n + 1, "asked again only after the backoff"


def test_check_all_gives_back_the_holds_when_one_limit_denies(fake: FakeCluster) -> None:
    with ringlimit.Client(fake.seeds, deadline_ms=2_000) as c:
        wide = [Check(f"w:{i}", limit=10, period_ms=60_000) for i in range(5)]
        tight = Check("t", limit=1, period_ms=60_000)
        assert c.check_all([*wide, tight]).allowed
        denied = c.check_all([*wide, tight])
        assert not denied.allowed and denied.binding == 5
        assert [a.remaining for a in denied.results[:5]] == [9] * 5, "read as if it never came"
        backs = [item for _, _, items in fake.calls("GiveBack") for item in items]
        assert sorted(k for k, _, _ in backs) == [f"w:{i}" for i in range(5)]
        assert all(tokens == 1 for _, tokens, _ in backs)
        for i in range(5):
            assert fake.shared.used[("inline:10/60000", f"w:{i}")] == 1
        held = [c for _, name, keys in fake.calls("CheckBatch") for c in keys]
        assert held, "sent as batches with hold"


def test_the_async_client_leases_too(fake: FakeCluster) -> None:
    async def run() -> None:
        async with ringlimit.aio.Client(fake.seeds, leases=True, hot_keys_rate=HOT_RATE, deadline_ms=2_000) as c:
            admitted = leased = 0
            end = time.monotonic() + 20
            while time.monotonic() < end and admitted < 5_000:
                a = await c.check("hot:a", rule="hot")
                admitted += a.allowed
                leased += a.leased
            assert admitted == 5_000 and leased > 0
            assert not (await c.check("hot:a", rule="hot")).allowed

    asyncio.run(run())


def test_checks_travel_on_one_stream_per_owner_in_both_clients(fake: FakeCluster) -> None:
    with ringlimit.Client(fake.seeds, token="s3cret-token", deadline_ms=2_000) as c:
        answers = [c.check(f"s:{i}", rule="api") for i in range(30)]
        assert all(a.allowed and not a.degraded for a in answers)
        assert len(fake.calls("CheckStream")) <= 3, "one stream per owner, kept"
        assert not fake.calls("Check") and not fake.calls("CheckBatch")
        assert c.stats()["streamed"] == 30
        assert set(fake.shared.metadata) == {"Bearer s3cret-token"}

    async def run() -> None:
        async with ringlimit.aio.Client(fake.seeds, deadline_ms=2_000) as c:
            answers = await asyncio.gather(*(c.check(f"a:{i}", rule="api") for i in range(30)))
            assert all(a.allowed and not a.degraded for a in answers)
            assert c.stats()["streamed"] > 0 and c.stats()["streams_opened"] <= 3

    asyncio.run(run())
    assert not fake.calls("Check") and not fake.calls("CheckBatch")


def test_a_node_without_the_stream_gets_unary_calls(fake: FakeCluster) -> None:
    fake.shared.stream_enabled = False
    with ringlimit.Client(fake.seeds, deadline_ms=2_000) as c:
        for i in range(10):
            a = c.check(f"u:{i}", rule="api")
            assert a.allowed and not a.degraded, "the refused stream's checks are sent again, unary"
        assert c.stats()["streamed"] == 0 and c.stats()["degraded"] == 0
        assert fake.calls("Check") or fake.calls("CheckBatch")

    async def run() -> None:
        async with ringlimit.aio.Client(fake.seeds, deadline_ms=2_000) as c:
            for i in range(10):
                a = await c.check(f"v:{i}", rule="api")
                assert a.allowed and not a.degraded
            assert c.stats()["streamed"] == 0

    asyncio.run(run())


def test_a_broken_stream_fails_over_and_the_next_check_reopens_it(fake: FakeCluster) -> None:
    fake.shared.stream_breaks_at = 3
    with ringlimit.Client(fake.seeds, deadline_ms=2_000) as c:
        got = [c.check("b:1", rule="api") for _ in range(2)]
        assert [a.degraded for a in got] == [False, False]
        broken = c.check("b:1", rule="api")
        assert broken.degraded and broken.allowed, "failed over to the local share, no exception"
        # The owner's circuit stays open a moment after a failure: then a new stream answers.
        wait_for("a direct answer again", lambda: not c.check("b:1", rule="api").degraded)
        assert c.stats()["streams_opened"] >= 2

    fake.shared.stream_requests = 0

    async def run() -> None:
        async with ringlimit.aio.Client(fake.seeds, deadline_ms=2_000) as c:
            got = [await c.check("b:2", rule="api") for _ in range(3)]
            assert [a.degraded for a in got] == [False, False, True]
            for _ in range(200):
                if not (await c.check("b:2", rule="api")).degraded:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("no direct answer after the stream broke")

    asyncio.run(run())


def test_a_stream_that_stops_answering_falls_back_at_the_deadline_and_is_replaced(fake: FakeCluster) -> None:
    with ringlimit.Client(fake.seeds, deadline_ms=150) as c:
        assert not c.check("h:1", rule="api").degraded
        fake.shared.stream_hangs = True
        hung = c.check("h:1", rule="api")
        assert hung.degraded, "answered by the fallback at the deadline"
        fake.shared.stream_hangs = False
        # The next check finds the request unanswered past the deadline: the stream is
        # aborted, and a new one answers.
        wait_for("a direct answer again", lambda: not c.check("h:1", rule="api").degraded)
        assert c.stats()["streams_opened"] >= 2

    async def run() -> None:
        async with ringlimit.aio.Client(fake.seeds, deadline_ms=150) as c:
            assert not (await c.check("h:2", rule="api")).degraded
            fake.shared.stream_hangs = True
            assert (await c.check("h:2", rule="api")).degraded
            fake.shared.stream_hangs = False
            for _ in range(200):
                if not (await c.check("h:2", rule="api")).degraded:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("no direct answer after the stream hung")
            assert c.stats()["streams_opened"] >= 2

    asyncio.run(run())
