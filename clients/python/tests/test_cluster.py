"""The client against a real three-node cluster started from ``$RINGLIMIT_BIN`` (skipped with
a note when unset): routing to owners (no check forwarded), exact limits across nodes,
batching, all-or-nothing with holds given back, reservations, leases, fail-open when a node is
SIGKILLed under load, the middleware. Every wait is bounded and on a condition."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List

import grpc
import pytest

import ringlimit
import ringlimit.aio
from cluster import Cluster, metric, needs_bin, wait_for
from ringlimit import Check, InvalidCheck, UnknownRule
from ringlimit.v1 import ratelimiter_pb2 as pb
from ringlimit.v1 import ratelimiter_pb2_grpc as pb_grpc

pytestmark = needs_bin

RULES = """
rules:
  - name: exact
    limit: 40
    period: 1h
  - name: window
    limit: 30
    period: 1h
    algorithm: fixed_window
  - name: closed
    limit: 5
    period: 1h
    on_owner_unreachable: closed
  - name: everywhere
    limit: 1000
    period: 1h
    mode: global
  - name: llm
    limit: 10000
    period: 1h
  - name: hot
    limit: 3000
    period: 1h
    algorithm: fixed_window
  - name: keep
    limit: 100000
    period: 1h
    lease: "off"
"""

#: Generous: the machine is small and shared; the fallback must not decide these tests.
DEADLINE_MS = 3_000
# Hot keys promoted at 20 checks/s (1,000 by default): the lease tests do not depend on how
# fast this machine runs a thread of checks.
HOT_RATE = 20.0
FORWARDING = ("ringlimit_forwarded_total", "ringlimit_relayed_total")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(3, rules=RULES, tmp=str(tmp_path_factory.mktemp("rules"))) as c:
        yield c


def sdk_calls(cluster: Cluster) -> bool:
    """Whether the nodes serve the SDK's calls (Topology, Lease, GiveBack, holds)."""
    stub = pb_grpc.RateLimiterStub(grpc.insecure_channel(cluster.nodes[0].grpc))
    try:
        stub.Topology(pb.TopologyRequest(), timeout=5)
        return True
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            return False
        raise


def needs_sdk_calls(cluster: Cluster) -> None:
    if not sdk_calls(cluster):
        pytest.skip("this ringlimit binary serves no Topology/Lease/GiveBack/holds (older than the SDK calls)")


def client(cluster: Cluster, **settings) -> ringlimit.Client:
    settings.setdefault("deadline_ms", DEADLINE_MS)
    return ringlimit.Client(cluster.seeds, grpc_addrs=cluster.grpc_addrs, **settings)


def forwarded(cluster: Cluster) -> float:
    return sum(metric(n.metrics(), m) for n in cluster.nodes for m in FORWARDING)


def test_checks_go_straight_to_their_owner(cluster: Cluster) -> None:
    with client(cluster) as c:
        assert c.members() == ["n0", "n1", "n2"]
        before = forwarded(cluster)
        for i in range(300):
            assert c.check(f"route:{i}", rule="llm").allowed
            assert c.check(f"route:{i}", limit=100, period_ms=60_000).allowed
            assert c.check(f"route:{i}", rule=ringlimit.Inline(100, 60_000, "sliding_window")).allowed
        assert forwarded(cluster) == before, "a check the SDK sent was forwarded or relayed"
        s = c.stats()
        assert s["direct"] == 900 and s["degraded"] == 0
        owners = {c.owner_of(f"route:{i}", rule="llm") for i in range(300)}
        assert owners == {"n0", "n1", "n2"}


def test_a_limit_is_exact_across_threads_and_clients(cluster: Cluster) -> None:
    with client(cluster) as a, client(cluster) as b:
        def spend(c: ringlimit.Client) -> int:
            return sum(c.check("exact:1", rule="exact").allowed for _ in range(30))

        with ThreadPoolExecutor(8) as pool:
            admitted = sum(pool.map(spend, [a, b] * 4))
        assert admitted == 40
        s, t = a.stats(), b.stats()
        assert s["degraded"] == 0 and t["degraded"] == 0
        # Concurrent checks for one owner were coalesced.
        assert s["batches"] < s["checks_sent"], s


def test_the_async_client_is_exact_and_batches(cluster: Cluster) -> None:
    async def run() -> None:
        async with ringlimit.aio.Client(cluster.seeds, grpc_addrs=cluster.grpc_addrs, deadline_ms=DEADLINE_MS) as c:
            got = await asyncio.gather(*(c.check("aio:1", rule="window") for _ in range(60)))
            assert sum(a.allowed for a in got) == 30
            assert not any(a.degraded for a in got)
            s = c.stats()
            assert s["batches"] < s["checks_sent"], s
            with pytest.raises(UnknownRule):
                await c.check("k", rule="no-such-rule")

    asyncio.run(run())


def test_unknown_rules_and_bad_checks_raise_the_nodes_codes(cluster: Cluster) -> None:
    with client(cluster) as c:
        with pytest.raises(UnknownRule) as e:
            c.check("k", rule="no-such-rule")
        assert e.value.code == "unknown_rule"
        with pytest.raises(InvalidCheck) as e2:
            c.check("k", rule="exact", cost=41)
        assert e2.value.code == "invalid_cost"


def test_a_global_rule_is_decided_by_any_member(cluster: Cluster) -> None:
    with client(cluster) as c:
        before = forwarded(cluster)
        assert all(c.check(f"g:{i}", rule="everywhere").allowed for i in range(20))
        assert forwarded(cluster) == before


def test_reserve_and_settle_at_the_owner(cluster: Cluster) -> None:
    with client(cluster) as c:
        with c.reserve("team:1", rule="llm", estimate=4_000) as r:
            assert r.allowed and r.answer.remaining == 6_000
            r.cost = 2_500
        assert r.settled is not None and r.settled.remaining == 7_500
        denied = c.reserve("team:1", rule="llm", estimate=9_000)
        assert not denied.allowed
        with denied:
            pass
        r2 = c.reserve("team:1", rule="llm", estimate=500)
        assert r2.settle(600).remaining == 6_900
        with pytest.raises(ringlimit.UnknownReservation):
            c.settle(r2.id, 1)


def test_check_all_gives_back_the_holds_of_a_denied_request(cluster: Cluster) -> None:
    needs_sdk_calls(cluster)
    with client(cluster) as c:
        keys = [f"all:{i}" for i in range(6)]
        # One limit nearly spent; the others at different owners.
        tight = Check("all:tight", limit=1, period_ms=3_600_000)
        wide = [Check(k, limit=10, period_ms=3_600_000) for k in keys]
        first = c.check_all([*wide, tight])
        assert first.allowed and not first.degraded
        assert first.binding == len(wide)
        second = c.check_all([*wide, tight])
        assert not second.allowed and second.binding == len(wide)
        for k in keys:
            assert c.check(k, limit=10, period_ms=3_600_000, cost=0).remaining == 9, "its hold was given back"
        assert c.stats()["given_back"] == len(wide)


def test_hot_keys_are_leased_and_never_admit_more_than_the_limit(cluster: Cluster) -> None:
    needs_sdk_calls(cluster)
    with client(cluster, leases=True, hot_keys_rate=HOT_RATE) as c:
        before = forwarded(cluster)
        admitted = 0
        leased = 0
        deadline = time.monotonic() + 20
        # Past the limit: 3000 per hour on a fixed window, checked as hot as this thread can.
        while time.monotonic() < deadline and admitted < 3_000:
            a = c.check("hot:1", rule="hot")
            admitted += a.allowed
            leased += a.leased and a.allowed
        for _ in range(2_000):
            a = c.check("hot:1", rule="hot")
            admitted += a.allowed
        assert admitted == 3_000, "never more than the limit, and all of it"
        assert leased > 0, c.stats()
        s = c.stats()
        assert s["lease_grants"] > 0 and s["degraded"] == 0, s
        assert forwarded(cluster) == before


def test_a_rule_with_lease_off_stays_at_its_owner(cluster: Cluster) -> None:
    needs_sdk_calls(cluster)
    with client(cluster, leases=True, hot_keys_rate=HOT_RATE) as c:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            assert not c.check("keep:1", rule="keep").leased
        assert c.stats()["lease_asks"] == 0


def test_the_example_service_against_the_cluster(cluster: Cluster) -> None:
    from fastapi.testclient import TestClient

    import guarded_service

    c = ringlimit.Client(cluster.seeds, grpc_addrs=cluster.grpc_addrs, deadline_ms=DEADLINE_MS)
    try:
        http = TestClient(guarded_service.build(c))
        got = [http.get("/hello", headers={"x-api-key": "carol"}) for _ in range(6)]
        assert [r.status_code for r in got] == [200] * 5 + [429]
        assert got[0].headers["ratelimit-policy"] == '"5-per-10000ms";q=5;w=10'
        assert got[4].headers["x-ratelimit-remaining"] == "0"
        assert int(got[5].headers["retry-after"]) >= 1
    finally:
        c.close()


def test_fail_open_while_a_node_is_killed_under_load(tmp_path) -> None:
    with Cluster(3, rules=RULES, tmp=str(tmp_path)) as cl:
        c = ringlimit.Client(cl.seeds, grpc_addrs=cl.grpc_addrs, deadline_ms=1_000, refresh_interval_ms=200)
        try:
            victim = "n2"
            keys = [f"kill:{i}" for i in range(60)]
            owned = [k for k in keys if c.owner_of(k, rule="llm") == victim]
            assert owned
            errors: List[BaseException] = []
            stop = threading.Event()
            degraded_for: set = set()

            def load() -> None:
                while not stop.is_set():
                    for k in keys:
                        try:
                            a = c.check(k, rule="llm")
                            if a.degraded:
                                degraded_for.add(k)
                        except BaseException as e:  # the point: none may reach the app
                            errors.append(e)

            threads = [threading.Thread(target=load) for _ in range(3)]
            for t in threads:
                t.start()
            wait_for("checks flowing", lambda: c.stats()["direct"] > 200)
            cl.node(victim).kill()
            # Degraded only while the dead owner is still in the topology; then its keys move.
            wait_for("the dead node leaves the topology", lambda: victim not in c.members(), within=30)
            wait_for(
                "the dead node's keys answered by their new owners",
                lambda: all(not c.check(k, rule="llm").degraded for k in owned),
                within=10,
            )
            stop.set()
            for t in threads:
                t.join(timeout=10)
            assert errors == []
            assert degraded_for <= set(owned), "only the dead node's keys were ever degraded"
            assert c.stats()["degraded"] > 0
            # The checks travelled on the owners' check streams (the killed one's broke).
            assert c.stats()["streamed"] > 0 and c.stats()["streams_opened"] >= 3, c.stats()
        finally:
            c.close()


def test_the_async_clients_checks_fail_over_when_a_streams_node_is_killed(tmp_path) -> None:
    async def run(cl: Cluster) -> None:
        async with ringlimit.aio.Client(cl.seeds, grpc_addrs=cl.grpc_addrs, deadline_ms=1_000) as c:
            victim = "n1"
            keys = [f"akill:{i}" for i in range(40)]
            owned = [k for k in keys if c._sync.owner_of(k, rule="llm") == victim]
            assert owned
            for k in keys:
                assert not (await c.check(k, rule="llm")).degraded
            assert c.stats()["streamed"] > 0, c.stats()
            cl.node(victim).kill()
            # Its stream breaks: its keys' checks fall back (never an exception), the others'
            # stay direct.
            end = time.monotonic() + 10
            degraded: set = set()
            while time.monotonic() < end and not degraded:
                got = await asyncio.gather(*(c.check(k, rule="llm") for k in keys))
                degraded |= {k for k, a in zip(keys, got) if a.degraded}
                assert all(a.allowed for a in got)
            assert degraded and degraded <= set(owned), (degraded, owned)

    with Cluster(3, rules=RULES, tmp=str(tmp_path)) as cl:
        asyncio.run(run(cl))


def test_leases_need_the_client_credential_when_nodes_have_a_secret(tmp_path) -> None:
    env = {"RINGLIMIT_CLUSTER_SECRET": "a-cluster-secret-of-some-length", "RINGLIMIT_CLIENT_TOKEN": "a-client-token-0123456789"}
    with Cluster(3, env=env, rules=RULES, tmp=str(tmp_path)) as cl:
        needs_sdk_calls(cl)
        with ringlimit.Client(cl.seeds, token=env["RINGLIMIT_CLIENT_TOKEN"], grpc_addrs=cl.grpc_addrs, leases=True, hot_keys_rate=HOT_RATE, deadline_ms=DEADLINE_MS) as c:
            admitted = 0
            end = time.monotonic() + 15
            while time.monotonic() < end and c.stats()["lease_grants"] == 0:
                admitted += c.check("auth:1", rule="hot").allowed
            assert c.stats()["lease_grants"] > 0, c.stats()
        with ringlimit.Client(cl.seeds, grpc_addrs=cl.grpc_addrs, leases=True, hot_keys_rate=HOT_RATE, deadline_ms=DEADLINE_MS) as anon:
            end = time.monotonic() + 2
            while time.monotonic() < end:
                anon.check("auth:2", rule="hot")
            assert anon.stats()["lease_grants"] == 0, "no credential, no slices"
