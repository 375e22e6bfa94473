"""Rules as the client knows them: named rules learnt from the cluster, inline rules given in a
check, resolved to what routing, the fallback and leases need (seed, capacity, mode)."""

from __future__ import annotations

import functools
from typing import Any, Dict, Mapping, NamedTuple, Optional

from . import _hash
from .errors import InvalidCheck
from .v1 import ratelimiter_pb2 as pb

NANOS_PER_MS = 1_000_000
MAX_LIMIT = 1_000_000_000
MAX_PERIOD_NS = 366 * 24 * 3600 * 1_000_000_000
MIN_EMISSION_NS = 1_000
MAX_SLIDING_LOG_LIMIT = 10_000
MAX_KEY_BYTES = 512
#: Algorithms whose buckets may be leased (core's ``lease::leasable``).
LEASABLE = frozenset(("token_bucket", "fixed_window", "sliding_window"))
HAS_BURST = frozenset(("token_bucket", "leaky_bucket"))
_PB_ALGORITHM = {
    "token_bucket": pb.TOKEN_BUCKET,
    "fixed_window": pb.FIXED_WINDOW,
    "sliding_window": pb.SLIDING_WINDOW,
    "sliding_log": pb.SLIDING_LOG,
    "leaky_bucket": pb.LEAKY_BUCKET,
}
_ALGORITHM_NAME = {v: k for k, v in _PB_ALGORITHM.items()}
_ALGORITHM_NAME[pb.ALGORITHM_UNSPECIFIED] = "token_bucket"


class Inline(NamedTuple):
    """An inline rule: ``limit`` per ``period_ms`` under ``algorithm`` (``token_bucket``,
    ``fixed_window``, ``sliding_window``, ``sliding_log``, ``leaky_bucket``); ``burst`` the
    capacity of token and leaky buckets (default ``limit``). Calendar windows: a
    ``fixed_window`` with ``period`` ``"1d"``, ``"1w"`` or ``"1mo"``, ``calendar=True`` and an
    IANA ``timezone`` (empty: UTC), ``period_ms`` 0."""

    limit: int
    period_ms: int = 0
    algorithm: str = "token_bucket"
    burst: Optional[int] = None
    period: str = ""
    calendar: bool = False
    timezone: str = ""


class Rule:
    """A rule resolved: what a check's routing, fallback and leases read."""

    __slots__ = (
        "name",
        "inline",
        "algorithm",
        "limit",
        "period_ns",
        "period_ms",
        "burst",
        "capacity",
        "global_mode",
        "fail_closed",
        "shadow",
        "leasable",
        "calendar",
        "seed",
        "policy_name",
        "_pb",
    )

    def __init__(
        self,
        *,
        name: Optional[str],
        inline: Optional[Inline],
        algorithm: str,
        limit: int,
        period_ns: int,
        burst: int,
        global_mode: bool = False,
        fail_closed: bool = False,
        shadow: bool = False,
        leasable: bool = True,
        calendar: Optional[str] = None,
        seed: int,
        policy_name: str,
    ) -> None:
        self.name = name
        self.inline = inline
        self.algorithm = algorithm
        self.limit = limit
        self.period_ns = period_ns
        self.period_ms = -(-period_ns // NANOS_PER_MS)
        self.burst = burst
        self.capacity = burst if algorithm in HAS_BURST else limit
        self.global_mode = global_mode
        self.fail_closed = fail_closed
        self.shadow = shadow
        self.leasable = leasable and algorithm in LEASABLE
        self.calendar = calendar
        self.seed = seed
        self.policy_name = policy_name
        self._pb: Optional[Any] = None

    def __repr__(self) -> str:
        what = self.name if self.name is not None else self.policy_name
        return f"Rule({what!r}, {self.limit}/{self.period_ms}ms {self.algorithm})"

    def same(self, other: "Rule") -> bool:
        """Whether both decide alike (a refresh that changes nothing keeps caches)."""
        return all(getattr(self, f) == getattr(other, f) for f in Rule.__slots__ if f != "_pb")

    def pb_inline(self) -> Any:
        """This inline rule as ringlimit.v1's ``InlineRule`` (built once)."""
        if self._pb is None and self.inline is not None:
            r = self.inline
            msg = pb.InlineRule(
                limit=r.limit,
                period_ms=r.period_ms,
                algorithm=_PB_ALGORITHM[r.algorithm],
                period=r.period,
                calendar=r.calendar,
                timezone=r.timezone,
            )
            if r.burst is not None:
                msg.burst = r.burst
            self._pb = msg
        return self._pb

    def fill(self, msg: Any) -> None:
        """Sets a message's ``rule_spec`` oneof (``rule`` or ``inline``) to this rule."""
        if self.name is not None:
            msg.rule = self.name
        else:
            msg.inline.CopyFrom(self.pb_inline())


def _invalid(code: str, message: str) -> InvalidCheck:
    return InvalidCheck(code, message)


def validate_key(key: str) -> None:
    """1 to 512 bytes, as a node checks it."""
    if not isinstance(key, str):
        raise _invalid("invalid_key", "`key` must be a string")
    n = len(key.encode())
    if n == 0 or n > MAX_KEY_BYTES:
        raise _invalid("invalid_key", f"`key` must be 1 to {MAX_KEY_BYTES} bytes, got {n}")


@functools.lru_cache(maxsize=1)
def _zones() -> Dict[str, str]:
    import zoneinfo

    return {z.lower(): z for z in zoneinfo.available_timezones()}


def canonical_zone(zone: str) -> str:
    """The IANA database's spelling of ``zone`` (``europe/berlin`` is ``Europe/Berlin``);
    ``UTC`` when empty."""
    if not zone:
        return "UTC"
    if zone.upper() == "UTC":
        return "UTC"
    found = _zones().get(zone.lower())
    if found is None:
        raise _invalid("invalid_period", f"unknown time zone {zone!r}")
    return found


def policy_name(r: Inline, unit: Optional[str], zone: str) -> str:
    """The name an inline rule goes by in the IETF fields (core's ``inline_policy_name``)."""
    if unit is None:
        name = f"{r.limit}-per-{r.period_ms}ms"
    else:
        name = f"{r.limit}-per-{unit}-{zone}"
    if r.algorithm != "token_bucket":
        name += f"-{r.algorithm}"
    if r.burst is not None:
        name += f"-burst-{r.burst}"
    return name


def resolve_inline(r: Inline) -> Rule:
    """Validates an inline rule as a node does and resolves it (seed, capacity)."""
    if r.algorithm not in _hash.ALGORITHM_CODES:
        raise _invalid("unknown_algorithm", f"unknown algorithm {r.algorithm!r}")
    if not isinstance(r.limit, int) or not 1 <= r.limit <= MAX_LIMIT:
        raise _invalid("invalid_limit", f"`limit` must be between 1 and {MAX_LIMIT}, got {r.limit}")
    unit: Optional[str] = None
    zone = ""
    if r.calendar or r.period:
        if r.period not in _hash.CALENDAR_UNITS:
            raise _invalid("invalid_period", "`period` must be 1d, 1w or 1mo with `calendar`")
        if not r.calendar:
            raise _invalid("invalid_period", f"`period` {r.period} needs `calendar: true`")
        if r.algorithm != "fixed_window":
            raise _invalid(
                "invalid_request", f"`calendar` applies only to fixed_window, not {r.algorithm}"
            )
        unit = r.period
        code, period_ns = _hash.CALENDAR_UNITS[unit]
        if r.period_ms and r.period_ms * NANOS_PER_MS != period_ns:
            raise _invalid(
                "invalid_period",
                f"`period_ms` must be {period_ns // NANOS_PER_MS} for a calendar {unit}",
            )
        zone = canonical_zone(r.timezone)
    else:
        if r.timezone:
            raise _invalid("invalid_request", "`timezone` applies only with `calendar`")
        if not isinstance(r.period_ms, int) or r.period_ms <= 0:
            raise _invalid("invalid_period", "`period_ms` must be greater than 0")
        period_ns = r.period_ms * NANOS_PER_MS
        if period_ns > MAX_PERIOD_NS:
            raise _invalid("invalid_period", "`period_ms` must be between 1 and 31622400000")
    if r.algorithm == "sliding_log" and r.limit > MAX_SLIDING_LOG_LIMIT:
        raise _invalid(
            "invalid_limit",
            f"sliding_log allows a limit of at most {MAX_SLIDING_LOG_LIMIT}, got {r.limit}",
        )
    if r.burst is None:
        burst = r.limit
    elif r.algorithm not in HAS_BURST:
        raise _invalid(
            "invalid_burst", f"`burst` applies only to token_bucket and leaky_bucket, not {r.algorithm}"
        )
    elif not 1 <= r.burst <= MAX_LIMIT:
        raise _invalid("invalid_burst", f"`burst` must be between 1 and {MAX_LIMIT}, got {r.burst}")
    else:
        burst = r.burst
    if r.algorithm in HAS_BURST and period_ns // r.limit < MIN_EMISSION_NS:
        raise _invalid("invalid_limit", "`limit` is too high for the period (over 1 per µs)")
    code_ = _hash.ALGORITHM_CODES[r.algorithm]
    seed = _hash.inline_seed(code_, r.limit, period_ns, burst)
    if unit is not None:
        seed = _hash.calendar_seed(seed, _hash.CALENDAR_UNITS[unit][0], zone)
    return Rule(
        name=None,
        inline=r,
        algorithm=r.algorithm,
        limit=r.limit,
        period_ns=period_ns,
        burst=burst,
        calendar=unit,
        seed=seed,
        policy_name=policy_name(r, unit, zone),
    )


def from_info(info: Any) -> Optional[Rule]:
    """A rule of a ``TopologyResponse`` (``RuleInfo``); ``None`` for one no node would serve."""
    if info.limit == 0 or info.period_ms == 0:
        return None
    algorithm = _ALGORITHM_NAME.get(info.algorithm, "token_bucket")
    burst = info.burst if info.HasField("burst") else info.limit
    seed = info.seed or _hash.named_seed(info.name, _hash.ALGORITHM_CODES[algorithm])
    return Rule(
        name=info.name,
        inline=None,
        algorithm=algorithm,
        limit=info.limit,
        period_ns=info.period_ms * NANOS_PER_MS,
        burst=burst,
        global_mode=info.mode == pb.GLOBAL,
        fail_closed=info.fail_closed,
        shadow=info.shadow,
        leasable=info.leasable,
        calendar=info.period if info.calendar else None,
        seed=seed,
        policy_name=info.name,
    )


def from_json(r: Mapping[str, Any]) -> Optional[Rule]:
    """A rule of ``GET /v1/rules``; ``None`` for one no node would serve."""
    try:
        name = str(r["name"])
        limit = int(r["limit"])
        period_ms = int(r["period_ms"])
        algorithm = str(r.get("algorithm") or "token_bucket")
    except (KeyError, TypeError, ValueError):
        return None
    if limit == 0 or period_ms == 0 or algorithm not in _hash.ALGORITHM_CODES:
        return None
    burst = r.get("burst")
    calendar = bool(r.get("calendar"))
    return Rule(
        name=name,
        inline=None,
        algorithm=algorithm,
        limit=limit,
        period_ns=period_ms * NANOS_PER_MS,
        burst=int(burst) if burst is not None else limit,
        global_mode=r.get("mode") == "global",
        fail_closed=r.get("on_owner_unreachable") == "closed",
        shadow=bool(r.get("shadow")),
        leasable=r.get("lease", "auto") != "off",
        calendar=str(r.get("period")) if calendar else None,
        seed=_hash.named_seed(name, _hash.ALGORITHM_CODES[algorithm]),
        policy_name=name,
    )
