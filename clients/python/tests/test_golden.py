"""Every case of clients/golden/owners.json: the rule's seed, the bucket id, the owner in each
ring, and the sampled ring points, as the nodes compute them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringlimit import _hash
from ringlimit._rules import Inline, resolve_inline

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "owners.json"


def golden() -> dict:
    return json.loads(GOLDEN.read_text())


def seed_of(rule: dict) -> int:
    if "inline" in rule:
        r = rule["inline"]
        return resolve_inline(
            Inline(
                limit=r["limit"],
                period_ms=r["period_ms"],
                algorithm=r["algorithm"],
                burst=r["burst"],
                period=r["period"],
                calendar=r["calendar"],
                timezone=r["timezone"],
            )
        ).seed
    return _hash.named_seed(rule["name"], _hash.ALGORITHM_CODES[rule["algorithm"]])


def test_the_scheme_and_vnodes_are_ours() -> None:
    g = golden()
    assert g["scheme"] == _hash.SCHEME
    assert g["vnodes_per_member"] == _hash.VNODES_PER_MEMBER


def test_ring_points() -> None:
    g = golden()
    n = 0
    for ring, samples in g["ring_points"].items():
        for member, i, point in samples:
            assert _hash.point(member, i) == int(point), (ring, member, i)
            n += 1
    assert n > 0


def test_every_case_seed_bucket_and_owner() -> None:
    g = golden()
    rings = {name: _hash.Ring(members) for name, members in g["rings"].items()}
    assert len(g["cases"]) >= 100
    for case in g["cases"]:
        seed = seed_of(case["rule"])
        assert seed == int(case["seed"]), case
        bucket = _hash.bucket_id(seed, case["key"])
        assert bucket == int(case["bucket_id"]), case
        for ring, owner in case["owners"].items():
            assert rings[ring].owner(bucket) == owner, (ring, case)


def test_a_ring_ignores_order_and_duplicates() -> None:
    g = golden()
    members = g["rings"]["five"]
    a = _hash.Ring(members)
    b = _hash.Ring(list(reversed(members)) + members[:2])
    for case in g["cases"]:
        bucket = int(case["bucket_id"])
        assert a.owner(bucket) == b.owner(bucket)
        assert a.successors(bucket)[0] == a.owner(bucket)
    assert _hash.Ring([]).owner(1) is None


@pytest.mark.parametrize("zone", ["europe/berlin", "EUROPE/BERLIN", "Europe/Berlin"])
def test_time_zones_are_hashed_as_the_database_spells_them(zone: str) -> None:
    rule = Inline(limit=10, period="1d", algorithm="fixed_window", calendar=True, timezone=zone)
    same = Inline(limit=10, period="1d", algorithm="fixed_window", calendar=True, timezone="Europe/Berlin")
    assert resolve_inline(rule).seed == resolve_inline(same).seed
