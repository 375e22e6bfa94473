"""The fallback share: limit ÷ alive members (rounded down, at least 1), or a fraction."""

from __future__ import annotations

from ringlimit._fallback import Fallback, fraction_of, share_of
from ringlimit._rules import Inline, resolve_inline

HOUR = 3_600_000


def admitted(f: Fallback, id: int, rule, alive: int, tries: int = 100) -> int:
    n = 0
    for _ in range(tries):
        a, _ = f.decide(id, rule, 1, alive)
        assert a.degraded and a.limit == rule.limit
        n += a.allowed
    return n


def test_per_member_the_limit_is_divided_among_the_members_alive() -> None:
    f = Fallback()
    rule = resolve_inline(Inline(12, HOUR))
    assert admitted(f, 1, rule, 1) == 12
    assert admitted(f, 2, rule, 3) == 4
    assert admitted(f, 3, rule, 100) == 1, "never less than one"
    assert share_of(10, 10, 3) == (3, 3), "rounded down: shares never add up to more"
    assert share_of(10, 10, 0) == (10, 10)


def test_a_fraction_is_that_fraction_rounded_up() -> None:
    f = Fallback(fraction=0.25)
    rule = resolve_inline(Inline(10, HOUR))
    assert admitted(f, 1, rule, 1) == 3
    assert admitted(f, 2, rule, 5) == 3, "whatever the members"
    assert fraction_of(10, 20, 0.01) == (1, 1)


def test_every_algorithm_holds_its_share() -> None:
    for algorithm in ("token_bucket", "fixed_window", "sliding_window", "sliding_log", "leaky_bucket"):
        f = Fallback()
        rule = resolve_inline(Inline(9, HOUR, algorithm))
        assert admitted(f, 7, rule, 3) == 3, algorithm
        denied, _ = f.decide(7, rule, 1, 3)
        assert not denied.allowed and denied.retry_after_ms > 0, (algorithm, denied)


def test_a_rule_never_learnt_is_admitted_and_a_fail_closed_one_denied() -> None:
    f = Fallback()
    a, taken = f.decide(1, None, 1, 1)
    assert a.allowed and a.degraded and a.limit == 0 and taken is None
    rule = resolve_inline(Inline(10, HOUR))
    rule.fail_closed = True
    a, taken = f.decide(1, rule, 1, 1)
    assert not a.allowed and a.degraded and a.retry_after_ms == 1000 and taken is None
    assert len(f) == 0, "neither holds a bucket"


def test_what_a_share_took_is_given_back_and_buckets_are_bounded() -> None:
    for algorithm in ("token_bucket", "fixed_window", "sliding_window"):
        f = Fallback(max_keys=2)
        rule = resolve_inline(Inline(1, HOUR, algorithm))
        a, taken = f.decide(1, rule, 1, 1)
        assert a.allowed and taken is not None and taken.cost == 1
        assert not f.decide(1, rule, 1, 1)[0].allowed
        f.refund(rule, taken, 1)
        assert f.decide(1, rule, 1, 1)[0].allowed, algorithm
        for id in range(2, 10):
            f.decide(id, rule, 1, 1)
        assert len(f) <= 2


def test_a_cost_of_zero_reads_without_taking() -> None:
    f = Fallback()
    rule = resolve_inline(Inline(2, HOUR))
    for _ in range(5):
        a, taken = f.decide(1, rule, 0, 1)
        assert a.allowed and a.remaining == 2 and taken is None
