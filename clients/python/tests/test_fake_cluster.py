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
