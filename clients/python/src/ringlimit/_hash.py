"""Bucket identities and owners, exactly as the nodes compute them (scheme ``xxh3-64-v1``).

XXH3 comes from the ``xxhash`` package (python-xxhash): a binding of the reference C library
by its upstream author's project, maintained for a decade, with wheels for every platform;
its ``xxh3_64_intdigest`` returns the 64-bit value as an int without a bytes round trip. The
scheme is described in ``clients/golden/README.md``; ``tests/test_golden.py`` proves every
case of ``clients/golden/owners.json``.
"""

from __future__ import annotations

import bisect
import struct
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import xxhash

SCHEME = "xxh3-64-v1"
VNODES_PER_MEMBER = 160

ALGORITHM_CODES: Dict[str, int] = {
    "token_bucket": 1,
    "fixed_window": 2,
    "sliding_window": 3,
    "sliding_log": 4,
    "leaky_bucket": 5,
}
CALENDAR_UNITS: Dict[str, Tuple[int, int]] = {
    # unit -> (code, nominal length in ns)
    "1d": (1, 86_400 * 1_000_000_000),
    "1w": (2, 7 * 86_400 * 1_000_000_000),
    "1mo": (3, 31 * 86_400 * 1_000_000_000),
}

_xxh3 = xxhash.xxh3_64_intdigest
_LE64 = struct.Struct("<Q")
_INLINE = struct.Struct("<BQQQ")


def named_seed(name: str, algorithm_code: int) -> int:
    """A named rule's seed: its name and algorithm."""
    return _xxh3(name.encode(), 0x6E616D656400 | algorithm_code)


def inline_seed(algorithm_code: int, limit: int, period_ns: int, burst: int) -> int:
    """An inline rule's seed: its parameters."""
    return _xxh3(_INLINE.pack(algorithm_code, limit, period_ns, burst), 0x696E6C696E65)


def calendar_seed(seed: int, unit_code: int, zone: str) -> int:
    """A calendar inline rule's seed: its plain seed with the unit and zone hashed in."""
    return _xxh3(bytes([unit_code]) + zone.encode(), seed ^ 0x63616C656E64)


def bucket_id(seed: int, key: str) -> int:
    """The identity of ``key``'s bucket under a rule of ``seed``."""
    return _xxh3(key.encode(), seed)


def point(member: str, i: int) -> int:
    """The ring point of ``member``'s ``i``-th virtual node."""
    return _xxh3(member.encode() + struct.pack("<I", i))


class Ring:
    """The consistent-hash ring over members' node ids. Immutable: rebuilt on a change."""

    __slots__ = ("members", "_points", "_owners")

    def __init__(self, members: Iterable[str], vnodes: int = VNODES_PER_MEMBER) -> None:
        self.members: Tuple[str, ...] = tuple(sorted(set(members)))
        pts: List[Tuple[int, int]] = []
        for at, m in enumerate(self.members):
            prefix = m.encode()
            for i in range(vnodes):
                pts.append((_xxh3(prefix + struct.pack("<I", i)), at))
        pts.sort()
        self._points: List[int] = [p for p, _ in pts]
        self._owners: List[str] = [self.members[at] for _, at in pts]

    def __len__(self) -> int:
        return len(self.members)

    def owner(self, id: int) -> Optional[str]:
        """The member that owns bucket ``id``; ``None`` for an empty ring."""
        n = len(self.members)
        if n <= 1:
            return self.members[0] if n else None
        i = bisect.bisect_left(self._points, _xxh3(_LE64.pack(id)))
        return self._owners[i if i < len(self._points) else 0]

    def successors(self, id: int) -> Sequence[str]:
        """Every member, the owner of ``id`` first, then clockwise (the replicas' order)."""
        if len(self.members) <= 1:
            return self.members
        i = bisect.bisect_left(self._points, _xxh3(_LE64.pack(id)))
        out: List[str] = []
        n = len(self._points)
        for k in range(n):
            m = self._owners[(i + k) % n]
            if m not in out:
                out.append(m)
                if len(out) == len(self.members):
                    break
        return out
