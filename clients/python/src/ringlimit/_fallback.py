"""The local limiter a client answers from when a key's owner cannot: the rule's share of the
limit (``limit ÷ alive members``, at least 1, as core's ``share_of``), kept in a bounded store
of this process, answered ``degraded``.

Token and leaky buckets are decided as a token bucket (GCRA), fixed windows as fixed windows
aligned to the epoch (a calendar rule's windows by its nominal length: an approximation, the
share is one anyway), sliding windows and sliding logs as the weighted two-window counter.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, List, Optional, Tuple

from ._rules import HAS_BURST, NANOS_PER_MS, Rule
from .answers import Answer

#: How long a fail-closed rule's denial asks the caller to wait (core's CLOSED_RETRY_MS).
CLOSED_RETRY_MS = 1_000


def share_of(limit: int, burst: int, alive: int) -> Tuple[int, int]:
    """One member's share of a limit and burst among ``alive`` members: rounded down so that
    the shares never add up to more than the rule, never below 1."""
    n = max(alive, 1)
    return max(limit // n, 1), max(burst // n, 1)


def fraction_of(limit: int, burst: int, f: float) -> Tuple[int, int]:
    """``f`` of a limit and burst, rounded up, never 0 (a service that knows its instances)."""

    def scale(n: int) -> int:
        return min(max(int(-(-n * f // 1)), 1), n)

    return scale(limit), scale(burst)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Taken:
    """What a fallback admission took: enough to give it back (all-or-nothing)."""

    __slots__ = ("id", "cost", "window")

    def __init__(self, id: int, cost: int, window: int) -> None:
        self.id = id
        self.cost = cost
        self.window = window


class Fallback:
    """A bounded store of share buckets (least recently used dropped beyond ``max_keys``)."""

    def __init__(
        self,
        max_keys: int = 100_000,
        fraction: Optional[float] = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._buckets: "OrderedDict[int, List[Any]]" = OrderedDict()
        self._max = max(max_keys, 1)
        self._fraction = fraction
        self._lock = threading.Lock()
        self.now = clock

    def __len__(self) -> int:
        return len(self._buckets)

    def share(self, rule: Rule, alive: int) -> Tuple[int, int]:
        if self._fraction is not None:
            return fraction_of(rule.limit, rule.burst, self._fraction)
        return share_of(rule.limit, rule.burst, alive)

    def decide(
        self, id: int, rule: Optional[Rule], cost: int, alive: int
    ) -> Tuple[Answer, Optional[Taken]]:
        """The fallback answer for bucket ``id`` of ``rule`` (``None``: never learnt, admitted
        with no limit), denied for a rule that fails closed."""
        now = self.now()
        if rule is None:
            return Answer(True, 0, 0, ceil_div(now, NANOS_PER_MS), 0, degraded=True), None
        if rule.fail_closed:
            now_ms = now // NANOS_PER_MS
            return (
                Answer(False, rule.limit, 0, now_ms + CLOSED_RETRY_MS, CLOSED_RETRY_MS, degraded=True),
                None,
            )
        limit, burst = self.share(rule, alive)
        capacity = burst if rule.algorithm in HAS_BURST else limit
        cost = min(cost, capacity)
        with self._lock:
            state = self._buckets.get(id)
            if state is None:
                state = [0, 0, 0]
                self._buckets[id] = state
                if len(self._buckets) > self._max:
                    self._buckets.popitem(last=False)
            else:
                self._buckets.move_to_end(id)
            if rule.algorithm in HAS_BURST:
                allowed, remaining, reset_ns, retry_ns, window = _gcra(state, limit, burst, rule.period_ns, now, cost)
            elif rule.algorithm == "fixed_window":
                allowed, remaining, reset_ns, retry_ns, window = _fixed(state, limit, rule.period_ns, now, cost)
            else:
                allowed, remaining, reset_ns, retry_ns, window = _sliding(state, limit, rule.period_ns, now, cost)
        answer = Answer(
            allowed,
            rule.limit,
            remaining,
            ceil_div(reset_ns, NANOS_PER_MS),
            ceil_div(retry_ns, NANOS_PER_MS),
            degraded=True,
        )
        taken = Taken(id, cost, window) if allowed and cost > 0 else None
        return answer, taken

    def refund(self, rule: Rule, taken: Taken, alive: int) -> None:
        """Gives back what :meth:`decide` took (another limit of an all-or-nothing check
        denied)."""
        limit, burst = self.share(rule, alive)
        with self._lock:
            state = self._buckets.get(taken.id)
            if state is None:
                return
            if rule.algorithm in HAS_BURST:
                t = ceil_div(rule.period_ns, limit)
                state[0] = max(state[0] - t * taken.cost, 0)
            elif state[0] == taken.window:
                state[1] = max(state[1] - taken.cost, 0)


def _gcra(state: List[int], limit: int, burst: int, period_ns: int, now: int, cost: int):
    """Token bucket as GCRA: ``state[0]`` the theoretical arrival time."""
    t = max(ceil_div(period_ns, max(limit, 1)), 1)
    capacity = t * burst
    base = max(state[0], now)
    after = base + t * max(cost, 1)
    fits = after - now <= capacity
    if fits and cost > 0:
        state[0] = after
        return True, (now + capacity - after) // t, after, 0, 0
    retry = 0 if fits else after - capacity - now
    return fits, max(now + capacity - base, 0) // t, base, retry, 0


def _fixed(state: List[int], limit: int, period_ns: int, now: int, cost: int):
    """Fixed window: ``state[0]`` the window's end, ``state[1]`` its count."""
    end = now - now % period_ns + period_ns
    if state[0] != end:
        state[0], state[1] = end, 0
    fits = state[1] + max(cost, 1) <= limit
    if fits and cost > 0:
        state[1] += cost
    return fits, max(limit - state[1], 0), end, 0 if fits else end - now, end


def _sliding(state: List[int], limit: int, period_ns: int, now: int, cost: int):
    """Weighted two-window counter: ``state[0]`` the current window's end, ``state[1]`` its
    count, ``state[2]`` the previous window's."""
    end = now - now % period_ns + period_ns
    if state[0] != end:
        previous = state[1] if state[0] == end - period_ns else 0
        state[0], state[1], state[2] = end, 0, previous
    elapsed = now - (end - period_ns)
    weighted = state[2] * (period_ns - elapsed)  # the previous count's weight, scaled by period
    used = weighted + state[1] * period_ns
    need = max(cost, 1) * period_ns
    fits = used + need <= limit * period_ns
    if fits and cost > 0:
        state[1] += cost
        used += cost * period_ns
    remaining = max(limit * period_ns - used, 0) // period_ns
    if fits:
        retry = 0
    elif state[2] and state[1] + max(cost, 1) <= limit:
        # Wait until the previous window's weight has slid below what is missing.
        over = used + need - limit * period_ns
        retry = min(ceil_div(over, state[2]), end - now)
    else:
        retry = end - now
    return fits, remaining, end, retry, end
