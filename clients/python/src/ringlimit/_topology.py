"""What the client knows of the cluster (members, their gRPC addresses, the ring, the rules)
and how it learns it: ``GET /v1/cluster`` and ``GET /v1/rules`` of an HTTP seed, ringlimit.v1
``Topology`` of a ``grpc://`` seed, then ``WatchTopology`` on one member to stay fresh."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.request
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from . import _hash, _rules
from ._rules import Rule


class Member(NamedTuple):
    node_id: str
    #: ``host:port`` of its ringlimit.v1 service; empty when it serves none.
    grpc_addr: str
    #: ``http://host:port`` (``https://`` with TLS); empty when unknown.
    http: str


class Topology:
    """An immutable snapshot, replaced whole on every change; read without a lock."""

    __slots__ = ("version", "members", "ring", "rules", "source", "_grpc_of")

    def __init__(
        self,
        version: int,
        members: Mapping[str, Member],
        rules: Optional[Dict[str, Rule]],
        source: str = "",
        vnodes: int = _hash.VNODES_PER_MEMBER,
    ) -> None:
        self.version = version
        self.members: Dict[str, Member] = dict(members)
        self.ring = _hash.Ring(self.members, vnodes)
        #: ``None`` until the rules were learnt once.
        self.rules = rules
        #: The node that told it.
        self.source = source
        self._grpc_of: Dict[str, str] = {}

    @classmethod
    def empty(cls) -> "Topology":
        return cls(0, {}, None)

    def alive(self) -> int:
        """Members alive in the ring, at least 1 (a limit's share)."""
        return max(len(self.members), 1)

    def route(self, id: int) -> Optional[str]:
        """The gRPC address to send bucket ``id``'s checks to: its owner's, or when the owner
        serves no gRPC the next member clockwise that does; ``None`` without one."""
        owner = self.ring.owner(id)
        if owner is None:
            return None
        addr = self.members[owner].grpc_addr
        if addr:
            return addr
        for m in self.ring.successors(id):
            if self.members[m].grpc_addr:
                return self.members[m].grpc_addr
        return None

    def owner_addr(self, id: int) -> Tuple[Optional[str], Optional[str]]:
        """Bucket ``id``'s owner and where to reach it."""
        return self.ring.owner(id), self.route(id)

    def same_as(self, other: "Topology") -> bool:
        """Same members at the same addresses and the same rules."""
        if self.members != other.members:
            return False
        if (self.rules is None) != (other.rules is None):
            return False
        if self.rules is None or other.rules is None:
            return True
        if self.rules.keys() != other.rules.keys():
            return False
        return all(r.same(other.rules[n]) for n, r in self.rules.items())

    def grpc_addrs(self) -> List[str]:
        return sorted({m.grpc_addr for m in self.members.values() if m.grpc_addr})

    def http_bases(self) -> List[str]:
        return sorted({m.http for m in self.members.values() if m.http})


class DiscoveryError(Exception):
    pass


def http_base(s: str, tls: bool = False) -> Optional[str]:
    """``http://host:port`` (``https://host:port`` with ``tls``) from a seed or a member's
    advertised address (no path); the other scheme is not accepted."""
    scheme = "https://" if tls else "http://"
    s = s.strip().rstrip("/")
    rest = s[len(scheme) :] if s.startswith(scheme) else s
    if "://" in rest or "/" in rest:
        return None
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return scheme + rest


def grpc_target(s: str) -> Optional[str]:
    """``host:port`` from a ``grpc://host:port`` seed."""
    s = s.strip().rstrip("/")
    if not s.startswith("grpc://"):
        return None
    rest = s[len("grpc://") :]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or "/" in rest or not port.isdigit():
        return None
    return rest


def _get_json(url: str, timeout: float, context: Optional[ssl.SSLContext]) -> Any:
    req = urllib.request.Request(url, headers={"accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:  # noqa: S310 (http(s) only)
            return json.loads(resp.read())
    # HTTPException: what a plaintext request to a TLS port (or any non-HTTP answer) reads as.
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        raise DiscoveryError(f"{url}: {e}") from e


def fetch_http(
    base: str,
    cluster_id: str,
    timeout: float,
    grpc_addrs: Mapping[str, str],
    version: int,
    context: Optional[ssl.SSLContext] = None,
) -> Topology:
    """Members and rules from one node's HTTP API (``grpc_addrs`` fills in members that
    advertise no ``grpc_addr``: nodes older than the field); over HTTPS with ``context``."""
    tls = context is not None
    cluster = _get_json(f"{base}/v1/cluster", timeout, context)
    if not isinstance(cluster, dict):
        raise DiscoveryError(f"{base}/v1/cluster: not a cluster view")
    if cluster.get("cluster_id") != cluster_id:
        raise DiscoveryError(f"{base} is a node of cluster {cluster.get('cluster_id')!r}")
    listed = _get_json(f"{base}/v1/rules", timeout, context)
    members: Dict[str, Member] = {}
    for m in cluster.get("members") or []:
        if not isinstance(m, dict) or m.get("state") != "alive":
            continue
        node_id = str(m.get("node_id") or "")
        if not node_id:
            continue
        http = http_base(str(m.get("http_addr") or ""), tls) or ""
        grpc = str(m.get("grpc_addr") or "") or grpc_addrs.get(node_id, "")
        members[node_id] = Member(node_id, grpc, http)
    rules: Dict[str, Rule] = {}
    for r in (listed or {}).get("rules") or []:
        rule = _rules.from_json(r) if isinstance(r, dict) else None
        if rule is not None and rule.name is not None:
            rules[rule.name] = rule
    return Topology(version, members, rules, source=str(cluster.get("node_id") or base))


def from_response(
    resp: Any, cluster_id: str, grpc_addrs: Mapping[str, str], version: Optional[int] = None, tls: bool = False
) -> Topology:
    """A ringlimit.v1 ``TopologyResponse`` as a topology (members' HTTP addresses as
    ``https://`` with ``tls``)."""
    if resp.cluster_id != cluster_id:
        raise DiscoveryError(f"{resp.node_id} is a node of cluster {resp.cluster_id!r}")
    if resp.ring.scheme and resp.ring.scheme != _hash.SCHEME:
        raise DiscoveryError(f"ring scheme {resp.ring.scheme!r} is not {_hash.SCHEME!r}")
    members = {
        m.node_id: Member(
            m.node_id,
            m.grpc_addr or grpc_addrs.get(m.node_id, ""),
            http_base(m.http_addr, tls) or "",
        )
        for m in resp.members
    }
    rules: Dict[str, Rule] = {}
    for info in resp.rules:
        rule = _rules.from_info(info)
        if rule is not None and rule.name is not None:
            rules[rule.name] = rule
    return Topology(
        resp.version if version is None else version,
        members,
        rules,
        source=resp.node_id,
        vnodes=resp.ring.vnodes_per_member or _hash.VNODES_PER_MEMBER,
    )
