"""Leases of hot keys, the holder's side (core's ``lease::Held`` and ``hot_keys``): which
buckets this client checks most (sampled), the slices their owners granted, and what is due
back to them. The checks of a leased bucket are decided in process on its slice.

A slice is an iterator over its remaining counts (``iter(range(tokens - 1, -1, -1))``): a check
of cost 1 takes a token with ``next()``, one call into C that the GIL runs whole, so two
threads never take the same token and the fast path needs no lock (an interpreter without the
GIL makes the client take a lock instead: ``GIL_GUARDS``). Each token is taken exactly once,
by a check or by the code that retires the slice (it drains what is left, and gives that
back), so the admissions never exceed the tokens granted.

Per algorithm, as core's ``lease::Held``: a window's slice is spent only while the window it
was counted in lasts (the owner's ``valid_ns`` says until when), a token bucket's within
``valid_ns`` (500 ms) of the ask; the time is measured from the ask, which left before the owner
decided, so the slice ends here no later than at the owner.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from operator import length_hint
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

from ._rules import NANOS_PER_MS, Rule

#: Whether ``next()`` on a C iterator is atomic here (CPython with its GIL).
GIL_GUARDS: bool = not (hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled())

#: A slice asked for is this much of the holder's demand (core's ``span_ns``).
SPAN_NS = 100 * NANOS_PER_MS
#: Most buckets leased at once.
MAX_LEASES = 1024
#: Demand assumed before any was measured (the hot keys' threshold), per second.
INITIAL_DEMAND_PER_S = 1_000
#: After an owner keeps a bucket to itself (or an ask failed), how long before asking again.
BACKOFF_NS = 1_000 * NANOS_PER_MS
#: Most slices of one bucket kept (the current one and renewals that came early).
MOST_GRANTS = 3
#: Hot keys: one check in this many is counted, with this weight (as a node does).
SAMPLE = 8
TICK_NS = 250 * NANOS_PER_MS
PROMOTE_AT = 1_000.0
DEMOTE_AT = 500.0
#: Most buckets the hot-key counter tracks between two ticks.
MOST_COUNTED = 4_096

_EMPTY: Iterator[int] = iter(())


def slice_of(tokens: int) -> Iterator[int]:
    """A slice of ``tokens``: each ``next()`` yields what is left after it."""
    return iter(range(tokens - 1, -1, -1))


def drain(it: Iterator[int]) -> int:
    """Takes every token left in a slice (each exactly once, against concurrent checks) and
    says how many there were."""
    n = 0
    for _ in it:
        n += 1
    return n


class Grant:
    __slots__ = ("tokens", "it", "until", "mark", "limit", "reset_at_ms")

    def __init__(self, tokens: int, until: int, mark: Any, limit: int, reset_at_ms: int) -> None:
        self.tokens = tokens
        self.it = slice_of(tokens)
        self.until = until
        self.mark = mark
        self.limit = limit
        self.reset_at_ms = reset_at_ms


class Entry:
    """A bucket this client checks: its identity and rule, the route to its owner (for one
    topology version), and its lease when it has one. The fields the fast path reads (``it``,
    ``until``, ``low``, ``queued``, ``limit``, ``reset_at_ms``) describe the current slice."""

    __slots__ = (
        "id",
        "key",
        "rule",
        "version",
        "addr",
        # The current slice (fast path).
        "it",
        "until",
        "low",
        "queued",
        "limit",
        "reset_at_ms",
        # The lease (under the leases' lock).
        "leased",
        "grants",
        "denied",
        "denied_until",
        "quiet_until",
        "asking",
        "last_granted",
        "granted_total",
        "returned_total",
        "demand_mark",
        "demand_at",
        "rate",
        "tick_mark",
    )

    def __init__(self, id: int, key: str, rule: Rule) -> None:
        self.id = id
        self.key = key
        self.rule = rule
        self.version = -1
        self.addr: Optional[str] = None
        self.it: Optional[Iterator[int]] = None
        self.until = 0
        self.low = 0
        self.queued = 0
        self.limit = rule.limit
        self.reset_at_ms = 0
        self.leased = False
        self.grants: Deque[Grant] = deque()
        self.denied: Optional[Any] = None
        self.denied_until = 0
        self.quiet_until = 0
        self.asking = False
        self.last_granted = 0
        self.granted_total = 0
        self.returned_total = 0
        self.demand_mark = 0
        self.demand_at = 0
        self.rate = 0.0
        self.tick_mark = 0

    def left(self) -> int:
        """Tokens left in its slices (a hint: checks may be taking them meanwhile)."""
        return sum(length_hint(g.it) for g in self.grants)

    def spent(self) -> int:
        """Tokens of its slices spent so far (a hint, as :meth:`left`)."""
        return self.granted_total - self.returned_total - self.left()

    def install(self) -> None:
        """Makes the front slice the current one (after the grants changed)."""
        if self.grants:
            g = self.grants[0]
            self.queued = sum(x.tokens for x in list(self.grants)[1:])
            self.limit = g.limit
            self.reset_at_ms = g.reset_at_ms
            # Asks come when less than half of the last slice is left.
            self.low = max(self.last_granted // 2 - self.queued, 0)
            self.until = g.until
            self.it = g.it
        else:
            self.it = None
            self.until = 0
            self.queued = 0


Return = Tuple[Entry, int, Any]


class Held:
    """The leases this client holds, with what is due to owners (asks and returns). Every
    method runs under the caller's lock (the client's leases lock)."""

    def __init__(self, clock: Any = time.monotonic_ns) -> None:
        self.entries: Dict[int, Entry] = {}
        self.due: List[Entry] = []
        self.returns: List[Return] = []
        self.clock = clock

    def want(self, e: Entry) -> bool:
        """Bucket ``e`` became hot: lease it (asked at once)."""
        if e.leased:
            return True
        if len(self.entries) >= MAX_LEASES or not e.rule.leasable or e.rule.global_mode:
            return False
        e.leased = True
        self.entries[e.id] = e
        e.demand_at = 0
        if not e.asking:
            e.asking = True
            self.due.append(e)
        return True

    def _retire(self, e: Entry, g: Grant) -> None:
        left = drain(g.it)
        e.returned_total += left
        if left > 0:
            self.returns.append((e, left, g.mark))

    def release(self, e: Entry) -> None:
        """Bucket ``e`` is no longer leased: what its slices hold goes back."""
        if not e.leased:
            return
        e.leased = False
        self.entries.pop(e.id, None)
        # The fast path first: no check takes from a slice being retired after this.
        e.it = None
        e.until = 0
        while e.grants:
            self._retire(e, e.grants.popleft())
        e.install()
        e.denied = None
        e.asking = False

    def release_all(self) -> int:
        n = 0
        for e in list(self.entries.values()):
            self.release(e)
            n += 1
        return n

    def advance(self, e: Entry, now: int) -> None:
        """Retires slices whose time is up or that are spent, and installs the next one."""
        changed = False
        while e.grants and (e.grants[0].until <= now or length_hint(e.grants[0].it) == 0):
            g = e.grants.popleft()
            if e.it is g.it:
                e.it = None
            self._retire(e, g)
            changed = True
        if changed or (e.grants and e.it is not e.grants[0].it):
            e.install()

    def take(self, e: Entry, cost: int, now: int) -> Optional[Tuple[bool, int, int]]:
        """A check of ``cost`` of leased bucket ``e`` that the fast path did not admit:
        ``(True, remaining, 0)`` admitted on a slice, ``(False, 0, retry_after_ms)`` denied as the
        owner said, ``None`` to the owner. Marks an ask due when the slices run low."""
        self.advance(e, now)
        took: Optional[int] = None
        if cost > 0 and e.it is not None:
            g = e.grants[0]
            if length_hint(g.it) >= cost:
                got = 0
                last = -1
                while got < cost:
                    last = next(g.it, -1)
                    if last < 0:
                        break
                    got += 1
                # A concurrent check took the last ones: those taken are lost (under-admission).
                if got == cost:
                    took = last + e.queued
        if took is None and e.denied is not None:
            if now < e.denied_until and cost > 0:
                wait = -(-(e.denied_until - now) // NANOS_PER_MS)
                return (False, 0, max(wait, 1))
            e.denied = None
        left = (length_hint(e.it) if e.it is not None else 0) + e.queued
        low = left * 2 < max(e.last_granted, 1)
        if not e.asking and now >= e.quiet_until and (took is None or low):
            e.asking = True
            self.due.append(e)
        if took is None:
            return None
        return (True, took, 0)

    def low(self, e: Entry) -> bool:
        """The fast path saw the current slice run low: ask now (``True`` when newly due)."""
        if e.asking or not e.leased or self.clock() < e.quiet_until:
            return False
        e.asking = True
        self.due.append(e)
        return True

    def take_due(self, now: int) -> List[Tuple[Entry, int, int, int]]:
        """The asks due now, each with ``(entry, want, demand_per_s, asked_at)``."""
        out = []
        due, self.due = self.due, []
        for e in due:
            if not e.leased:
                e.asking = False
                continue
            spent = e.spent()
            elapsed = now - e.demand_at
            if e.demand_at and elapsed > 0 and spent > e.demand_mark:
                demand = (spent - e.demand_mark) * 1_000_000_000 // elapsed
            else:
                demand = INITIAL_DEMAND_PER_S
            want = max(demand * SPAN_NS // 1_000_000_000, 1)
            out.append((e, want, demand, now))
        return out

    def granted(
        self, e: Entry, tokens: int, valid_ns: int, mark: Any, limit: int, reset_at_ms: int, asked: int, now: int
    ) -> None:
        """The owner granted a slice of ``tokens`` to the ask sent at ``asked``."""
        e.asking = False
        if not e.leased:
            # Released meanwhile: the slice goes straight back.
            if tokens > 0:
                self.returns.append((e, tokens, mark))
            return
        g = Grant(tokens, asked + valid_ns, mark, limit, reset_at_ms)
        e.grants.append(g)
        e.granted_total += tokens
        e.last_granted = tokens
        e.denied = None
        e.demand_mark = e.spent()
        e.demand_at = now
        while len(e.grants) > MOST_GRANTS:
            old = e.grants.popleft()
            if e.it is old.it:
                e.it = None
            self._retire(e, old)
        self.advance(e, now)
        e.install()

    def refused(self, e: Entry, answer: Any, asked: int, now: int) -> None:
        """The owner refused: ``answer.allowed`` false denies here until its retry_after;
        otherwise the owner keeps the bucket (asked again after the backoff)."""
        e.asking = False
        if not answer.allowed:
            e.denied = answer
            e.denied_until = asked + answer.retry_after_ms * NANOS_PER_MS
        else:
            e.quiet_until = now + BACKOFF_NS

    def failed(self, e: Entry, now: int, backoff_ns: int = BACKOFF_NS) -> None:
        """The ask got no answer, or an error: asked again after a backoff."""
        e.asking = False
        e.quiet_until = now + backoff_ns

    def take_returns(self, now: int) -> List[Return]:
        """What goes back to owners now: slices whose time is up, released buckets' slices."""
        for e in list(self.entries.values()):
            self.advance(e, now)
        out, self.returns = self.returns, []
        return out


class HotKeys:
    """Which buckets are checked most: counts sampled per tick (one check in ``SAMPLE``,
    weighted ``SAMPLE``; a leased bucket counts what its slices spent), halved every tick so
    that a steady rate ``r`` converges to ``2·r·w`` (core's ``hot_keys``); promoted at
    ``PROMOTE_AT`` checks/s, demoted below ``DEMOTE_AT`` (lower: no flapping)."""

    def __init__(self, promote_at: float = PROMOTE_AT) -> None:
        self.counts: Dict[Entry, int] = {}
        self.tracked: Dict[Entry, None] = {}
        # Demoted at half the promotion rate, as the defaults are (no flapping).
        self.promote_at = promote_at
        self.demote_at = promote_at * (DEMOTE_AT / PROMOTE_AT)

    def record(self, e: Entry) -> None:
        """Counts a sampled check of ``e`` (weight ``SAMPLE``)."""
        c = self.counts
        n = c.get(e)
        if n is not None:
            c[e] = n + SAMPLE
        elif len(c) < MOST_COUNTED:
            c[e] = SAMPLE

    def tick(self, leased: List[Entry], tick_ns: int = TICK_NS) -> Tuple[List[Entry], List[Entry]]:
        """Ends a tick: the buckets to promote (lease) and to demote (release)."""
        per_count = 1e9 / (2.0 * tick_ns)
        counts, self.counts = self.counts, {}
        for e in leased:
            spent = e.spent()
            counts[e] = counts.get(e, 0) + max(spent - e.tick_mark, 0)
            e.tick_mark = spent
        promoted: List[Entry] = []
        demoted: List[Entry] = []
        tracked: Dict[Entry, None] = {}
        for e in list(self.tracked) + [e for e in counts if e not in self.tracked]:
            e.rate = e.rate / 2 + counts.get(e, 0)
            rate = e.rate * per_count
            if e.leased:
                if rate < self.demote_at:
                    demoted.append(e)
            elif rate >= self.promote_at:
                promoted.append(e)
            if e.rate >= 1 or e.leased:
                tracked[e] = None
        self.tracked = tracked
        return promoted, demoted

    def rate(self, e: Entry, tick_ns: int = TICK_NS) -> float:
        """``e``'s checks per second as last ticked."""
        return e.rate * 1e9 / (2.0 * tick_ns)
