"""The holder's arithmetic (core's ``lease::Held``) with an injected clock: slices spent
exactly, renewed before running dry, retired with their window or their valid_ns, unspent
tokens given back, a refusal honoured, hot keys promoted and demoted."""

from __future__ import annotations

import threading
from typing import List

from ringlimit._leases import (
    BACKOFF_NS,
    INITIAL_DEMAND_PER_S,
    MOST_GRANTS,
    SAMPLE,
    TICK_NS,
    Entry,
    Held,
    HotKeys,
    drain,
    slice_of,
)
from ringlimit._rules import Inline, resolve_inline
from ringlimit.v1 import ratelimiter_pb2 as pb

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000 * MS

    def __call__(self) -> int:
        return self.now


def entry(algorithm: str = "token_bucket", limit: int = 1_000) -> Entry:
    return Entry(42, "k", resolve_inline(Inline(limit, 60_000, algorithm)))


def answer(allowed: bool, retry_after_ms: int = 0) -> pb.CheckResponse:
    return pb.CheckResponse(allowed=allowed, limit=1_000, retry_after_ms=retry_after_ms, reset_at_ms=5)


def fast(e: Entry, clock: Clock) -> int:
    """The client's fast path: -1 when it does not decide."""
    if e.it is None or clock() >= e.until:
        return -1
    return next(e.it, -1)


def test_a_slice_yields_what_is_left_and_each_token_once() -> None:
    it = slice_of(3)
    assert [next(it, -1) for _ in range(5)] == [2, 1, 0, -1, -1]
    it = slice_of(5)
    next(it)
    assert drain(it) == 4 and next(it, -1) == -1


def test_a_hot_bucket_is_asked_at_once_with_the_initial_demand() -> None:
    clock = Clock()
    held = Held(clock)
    e = entry()
    assert held.want(e) and e.leased and e.asking
    due = held.take_due(clock())
    assert len(due) == 1
    _, want, demand, asked = due[0]
    assert demand == INITIAL_DEMAND_PER_S and want == 100, "a tenth of a second of demand"
    assert held.take_due(clock()) == [], "asked once"


def test_a_grant_is_spent_exactly_then_the_owner_decides() -> None:
    clock = Clock()
    held = Held(clock)
    e = entry()
    held.want(e)
    (_, _, _, asked), = held.take_due(clock())
    held.granted(e, 10, 500 * MS, pb.Mark(reset_ns=1, at_ns=2), 1_000, 7, asked, clock())
    assert e.limit == 1_000 and e.reset_at_ms == 7
    got: List[int] = []
    while True:
        r = fast(e, clock)
        if r < 0:
            break
        got.append(r)
    assert got == list(range(9, -1, -1)), "10 admissions, never more"
    # The slow path finds it dry: to the owner, and an ask is due.
    assert held.take(e, 1, clock()) is None
    assert e.asking and held.due == [e]


def test_renewal_comes_before_running_dry() -> None:
    clock = Clock()
    held = Held(clock)
    e = entry()
    held.want(e)
    (_, _, _, asked), = held.take_due(clock())
    held.granted(e, 10, 500 * MS, pb.Mark(), 1_000, 7, asked, clock())
    assert e.low == 5
    for _ in range(5):
        r = fast(e, clock)
    assert r == 5 and not r < e.low
    r = fast(e, clock)
    assert r == 4 and r < e.low, "less than half left: the client asks now"
    assert held.low(e) and held.due == [e]
    # A renewal that comes early queues behind the current slice.
    (_, _, _, asked), = held.take_due(clock())
    held.granted(e, 20, 500 * MS, pb.Mark(), 1_000, 7, asked, clock())
    assert e.queued == 20
    assert fast(e, clock) == 3
    assert held.take(e, 1, clock()) == (True, 2 + 20, 0)


def test_a_slice_ends_with_its_validity_and_what_is_left_goes_back() -> None:
    clock = Clock()
    held = Held(clock)
    e = entry("fixed_window")
    held.want(e)
    (_, _, _, asked), = held.take_due(clock())
    mark = pb.Mark(reset_ns=9, at_ns=3)
    clock.now += 2 * MS  # the owner's answer came 2 ms after the ask
    held.granted(e, 10, 100 * MS, mark, 1_000, 7, asked, clock())
    assert e.until == asked + 100 * MS, "from the ask, not the answer"
    assert fast(e, clock) == 9
    clock.now = asked + 100 * MS
    assert fast(e, clock) == -1, "the window is over: nothing is admitted on it"
    assert held.take(e, 1, clock()) is None
    back = held.take_returns(clock())
    assert [(x[0], x[1], x[2]) for x in back] == [(e, 9, mark)]
    assert e.it is None and not e.grants


def test_a_refusal_that_denies_is_honoured_until_its_retry_after() -> None:
    clock = Clock()
    held = Held(clock)
    e = entry()
    held.want(e)
    (_, _, _, asked), = held.take_due(clock())
    held.refused(e, answer(False, retry_after_ms=30), asked, clock())
    clock.now += 10 * MS
    assert held.take(e, 1, clock()) == (False, 0, 20)
    assert held.take(e, 0, clock()) is None, "a read is the owner's"
    clock.now = asked + 30 * MS
    assert held.take(e, 1, clock()) is None
    assert e.denied is None


def test_an_owner_that_keeps_its_bucket_is_asked_again_after_the_backoff() -> None:
    clock = Clock()
    held = Held(clock)
    e = entry()
    held.want(e)
    (_, _, _, asked), = held.take_due(clock())
    held.refused(e, answer(True), asked, clock())
    assert held.take(e, 1, clock()) is None and held.due == []
    clock.now += BACKOFF_NS
    assert held.take(e, 1, clock()) is None and held.due == [e]


def test_releasing_gives_back_every_slice_and_a_late_grant_goes_straight_back() -> None:
    clock = Clock()
    held = Held(clock)
    e = entry()
    held.want(e)
    (_, _, _, asked), = held.take_due(clock())
    held.granted(e, 10, 500 * MS, pb.Mark(at_ns=1), 1_000, 7, asked, clock())
    fast(e, clock)
    held.release(e)
    assert not e.leased and e.it is None
    assert [(x[1], x[2].at_ns) for x in held.take_returns(clock())] == [(9, 1)]
    held.granted(e, 5, 500 * MS, pb.Mark(at_ns=2), 1_000, 7, asked, clock())
    assert [(x[1], x[2].at_ns) for x in held.take_returns(clock())] == [(5, 2)]


def test_at_most_three_slices_are_kept() -> None:
    clock = Clock()
    held = Held(clock)
    e = entry()
    held.want(e)
    for i in range(MOST_GRANTS + 1):
        e.asking = True
        held.granted(e, 10, 500 * MS, pb.Mark(at_ns=i), 1_000, 7, clock(), clock())
    assert len(e.grants) == MOST_GRANTS
    assert [(x[1], x[2].at_ns) for x in held.take_returns(clock())] == [(10, 0)]


def test_costs_above_one_take_from_the_slice_or_go_to_the_owner() -> None:
    clock = Clock()
    held = Held(clock)
    e = entry()
    held.want(e)
    held.take_due(clock())
    held.granted(e, 5, 500 * MS, pb.Mark(), 1_000, 7, clock(), clock())
    assert held.take(e, 3, clock()) == (True, 2, 0)
    assert held.take(e, 3, clock()) is None, "two left: the owner decides"
    assert fast(e, clock) == 1


def test_threads_never_take_more_than_granted() -> None:
    clock = Clock()
    held = Held(clock)
    e = entry()
    held.want(e)
    held.take_due(clock())
    held.granted(e, 20_000, 10_000 * MS, pb.Mark(), 1_000, 7, clock(), clock())
    admitted = [0] * 4

    def spend(i: int) -> None:
        while fast(e, clock) >= 0:
            admitted[i] += 1

    threads = [threading.Thread(target=spend, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 20_000


def test_hot_keys_are_promoted_at_a_thousand_a_second_and_demoted_below_five_hundred() -> None:
    hot = HotKeys()
    e = entry()
    # 300 checks in a tick of 250 ms (1200/s), sampled one in eight.
    for _ in range(300 // SAMPLE):
        hot.record(e)
    promoted, demoted = hot.tick([])
    assert promoted == [] , "one tick of 1200/s counts 2·r·w only after a few ticks"
    for _ in range(3):
        for _ in range(300 // SAMPLE):
            hot.record(e)
        promoted, demoted = hot.tick([])
    assert promoted == [e]
    # Leased now: its slices' spending is what counts; none spent, it cools.
    e.leased = True
    for _ in range(4):
        promoted, demoted = hot.tick([e])
    assert demoted == [e]
    assert TICK_NS == 250 * MS
