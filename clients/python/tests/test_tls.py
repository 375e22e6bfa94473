"""The client against nodes that serve HTTP and gRPC over TLS (``--tls-cert``), with
certificates this test makes (openssl, as the TLS guide does): checks reach their owners over
TLS, by ``https://`` and ``grpc://`` seeds, from both clients; a client that trusts another CA,
checks another name, or speaks plaintext is degraded, never raised at; the server name
override for certificates that name a host while members are dialed by IP."""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

import ringlimit
import ringlimit.aio
from cluster import Certs, Cluster, make_certs, needs_bin, needs_openssl

pytestmark = [needs_bin, needs_openssl]

HOUR = 3_600_000
#: Generous: the machine is small and shared; the fallback must not decide the direct checks.
DEADLINE_MS = 3_000
#: Short: the clients that cannot reach the cluster give up discovery soon.
GIVE_UP_MS = 300
NAME = "ringlimit.test"


class Pki:
    def __init__(self, ip: Certs, named: Certs, other: Certs) -> None:
        #: The nodes' certificate, for 127.0.0.1 (and localhost).
        self.ip = ip
        #: A certificate for NAME alone (dialed at 127.0.0.1 it needs the override).
        self.named = named
        #: Another CA, that signed none of the nodes' certificates.
        self.other = other


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = str(tmp_path_factory.mktemp("certs"))
    return Pki(
        make_certs(d, "DNS:localhost,IP:127.0.0.1", "ip"),
        make_certs(d, f"DNS:{NAME}", "named"),
        make_certs(d, "DNS:localhost,IP:127.0.0.1", "other"),
    )


@pytest.fixture(scope="module")
def cluster(pki: Pki) -> Iterator[Cluster]:
    with Cluster(2, tls=pki.ip) as c:
        yield c


def hostport(url: str) -> str:
    return url.split("://", 1)[1]


def checks_go_direct(c: ringlimit.Client, tag: str) -> None:
    """Keys of both members answered by their owners, a limit exact."""
    assert c.members() == ["n0", "n1"]
    assert all(c.check(f"tls:{tag}:{i}", limit=100, period_ms=HOUR).allowed for i in range(20))
    owners = {c.owner_of(f"tls:{tag}:{i}", limit=100, period_ms=HOUR) for i in range(20)}
    assert owners == {"n0", "n1"}, "keys of both members"
    got = [c.check(f"tls:{tag}:exact", limit=3, period_ms=HOUR).allowed for _ in range(4)]
    assert got == [True, True, True, False]
    s = c.stats()
    assert s["direct"] == 24 and s["degraded"] == 0, s


def test_checks_reach_their_owners_over_tls(cluster: Cluster, pki: Pki) -> None:
    assert all(s.startswith("https://") for s in cluster.seeds)
    with ringlimit.Client(cluster.seeds, tls_ca=pki.ip.ca, deadline_ms=DEADLINE_MS) as c:
        checks_go_direct(c, "https")
        assert c.stats()["streams_opened"] >= 1


def test_grpc_seeds_and_ca_as_bytes(cluster: Cluster, pki: Pki) -> None:
    with open(pki.ip.ca, "rb") as f:
        pem = f.read()
    seed = "grpc://" + cluster.nodes[1].grpc  # type: ignore[operator]
    with ringlimit.Client([seed], tls_ca=pem, deadline_ms=DEADLINE_MS) as c:
        checks_go_direct(c, "grpc")


def test_the_async_client_over_tls(cluster: Cluster, pki: Pki) -> None:
    async def run() -> None:
        async with ringlimit.aio.Client(cluster.seeds, tls_ca=pki.ip.ca, deadline_ms=DEADLINE_MS) as c:
            assert await c.ready(10.0)
            got = await asyncio.gather(*(c.check("tls:aio", limit=5, period_ms=HOUR) for _ in range(8)))
            assert sum(a.allowed for a in got) == 5
            assert not any(a.degraded for a in got)

    asyncio.run(run())


def assert_degraded(c: ringlimit.Client) -> None:
    assert c.members() == []
    got = [c.check("tls:fallback", limit=2, period_ms=HOUR) for _ in range(3)]
    assert [a.allowed for a in got] == [True, True, False]
    assert all(a.degraded for a in got)
    s = c.stats()
    assert s["direct"] == 0 and s["refresh_failures"] >= 1, s


def test_another_ca_is_degraded_not_raised(cluster: Cluster, pki: Pki) -> None:
    grpc_seed = "grpc://" + cluster.nodes[0].grpc  # type: ignore[operator]
    for seeds in (cluster.seeds, [grpc_seed]):
        with ringlimit.Client(seeds, tls_ca=pki.other.ca, discovery_timeout_ms=GIVE_UP_MS) as c:
            assert_degraded(c)

    async def run() -> None:
        async with ringlimit.aio.Client(cluster.seeds, tls_ca=pki.other.ca, discovery_timeout_ms=GIVE_UP_MS) as c:
            assert not await c.ready(1.0)
            a = await c.check("tls:aio-fallback", limit=2, period_ms=HOUR)
            assert a.allowed and a.degraded

    asyncio.run(run())


def test_plaintext_against_tls_is_degraded_not_raised(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    for seed in ("http://" + hostport(node.http or ""), "grpc://" + (node.grpc or "")):
        with ringlimit.Client([seed], discovery_timeout_ms=GIVE_UP_MS) as c:
            assert_degraded(c)


def test_a_name_the_certificate_lacks_is_degraded(cluster: Cluster, pki: Pki) -> None:
    # The override is in force: the nodes' certificate names 127.0.0.1 and localhost only.
    with ringlimit.Client(
        cluster.seeds, tls_ca=pki.ip.ca, tls_server_name=NAME, discovery_timeout_ms=GIVE_UP_MS
    ) as c:
        assert_degraded(c)


def test_the_server_name_override_for_certificates_of_a_host(pki: Pki) -> None:
    with Cluster(1, tls=pki.named) as named:
        assert named.seeds[0].startswith("https://127.0.0.1:")
        # Dialed by IP, the certificate names a host: refused without the override...
        with ringlimit.Client(named.seeds, tls_ca=pki.named.ca, discovery_timeout_ms=GIVE_UP_MS) as c:
            assert_degraded(c)
        # ...and every member (seed, topology addresses) checked against it with the override.
        with ringlimit.Client(named.seeds, tls_ca=pki.named.ca, tls_server_name=NAME, deadline_ms=DEADLINE_MS) as c:
            assert c.members() == ["n0"]
            got = [c.check("tls:named", limit=2, period_ms=HOUR) for _ in range(3)]
            assert [a.allowed for a in got] == [True, True, False]
            assert c.stats()["degraded"] == 0
