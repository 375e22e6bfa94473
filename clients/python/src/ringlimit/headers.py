"""The rate-limit headers a node's HTTP edge writes (core's ``headers.rs``), for middleware:
``X-RateLimit-Limit``/``-Remaining``/``-Reset`` (Unix seconds, rounded up), ``Retry-After``
(whole seconds, rounded up, at least 1) and the IETF ``RateLimit-Policy`` and ``RateLimit``
fields (draft-ietf-httpapi-ratelimit-headers-11), one list item per limit:
``"name";q=<limit>;w=<period, s>`` and ``"name";r=<remaining>;t=<s until full or reset>``."""

from __future__ import annotations

import time
from typing import Iterable, List, Optional, Tuple

from .answers import Answer

NANOS_PER_MS = 1_000_000

Policy = Tuple[str, int, Answer]
"""One limit as the IETF fields describe it: its name, its period in ms, its answer."""


def instant_ms(ns: int) -> int:
    """An instant in Unix ms as answers state it: rounded up (core's ``instant_ms``)."""
    return -(-ns // NANOS_PER_MS)


def now_ms() -> int:
    return instant_ms(time.time_ns())


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def sf_string(s: str) -> str:
    """A structured-field string (RFC 8941 §3.3.3): printable ASCII in quotes, ``"`` and
    ``\\`` escaped, anything else dropped."""
    out = ['"']
    for c in s:
        if " " <= c <= "~":
            if c in '"\\':
                out.append("\\")
            out.append(c)
    out.append('"')
    return "".join(out)


def ietf_values(limits: Iterable[Policy], now: Optional[int] = None) -> Tuple[str, str]:
    """The values of ``RateLimit-Policy`` and ``RateLimit`` for ``limits`` (``now`` in Unix
    ms rounded up, default the clock's). A window shorter than a second is ``w=1``."""
    at = now_ms() if now is None else now
    policy: List[str] = []
    state: List[str] = []
    for name, period_ms, a in limits:
        quoted = sf_string(name)
        w = max(_ceil_div(period_ms, 1000), 1)
        t = _ceil_div(max(a.reset_at_ms - at, 0), 1000)
        policy.append(f"{quoted};q={a.limit};w={w}")
        state.append(f"{quoted};r={a.remaining};t={t}")
    return ", ".join(policy), ", ".join(state)


def retry_after_secs(a: Answer) -> int:
    """Whole seconds to wait before retrying a denied check: rounded up, at least 1."""
    return max(_ceil_div(a.retry_after_ms, 1000), 1)


def rate_headers(a: Answer) -> List[Tuple[str, str]]:
    """``X-RateLimit-*`` of an answer (none when its limit is unknown: no node reached yet)."""
    if a.limit == 0:
        return []
    return [
        ("X-RateLimit-Limit", str(a.limit)),
        ("X-RateLimit-Remaining", str(a.remaining)),
        ("X-RateLimit-Reset", str(_ceil_div(a.reset_at_ms, 1000))),
    ]


def headers_for(limits: List[Policy], binding: Answer, now: Optional[int] = None) -> List[Tuple[str, str]]:
    """Every header of a guarded response: ``X-RateLimit-*`` of the binding limit, the IETF
    fields of every limit whose period and limit are known, ``Retry-After`` when denied."""
    out = rate_headers(binding)
    known = [(n, p, a) for n, p, a in limits if p > 0 and a.limit > 0]
    if known:
        policy, state = ietf_values(known, now)
        out.append(("RateLimit-Policy", policy))
        out.append(("RateLimit", state))
    if not binding.allowed:
        out.append(("Retry-After", str(retry_after_secs(binding))))
    return out
