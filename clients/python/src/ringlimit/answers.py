"""What a check answers (:class:`Answer`) and what an all-or-nothing check answers
(:class:`AllAnswer`)."""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Dict, List, Optional


_FIELDS = (
    "allowed",
    "limit",
    "remaining",
    "reset_at_ms",
    "retry_after_ms",
    "degraded",
    "leased",
    "replica",
    "blocked",
    "shadow_denied",
)


class Answer(tuple):  # type: ignore[type-arg]
    """A check's answer, as a node's ``POST /v1/check`` gives it (immutable).

    ``allowed``: admitted (for a shadow rule always, see ``shadow_denied``). ``limit``: the
    rule's limit (0 when the rule was never learnt). ``remaining``: whole requests still
    admissible now. ``reset_at_ms``: Unix ms when the bucket is full again or the window resets.
    ``retry_after_ms``: 0 when allowed, else the wait. ``degraded``: answered without the key's
    owner (the local fallback share). ``leased``: decided in this process on a slice leased from
    the owner. ``replica``: decided by the owner's replica. ``blocked``: denied by a block of the
    key. ``shadow_denied``: for a shadow rule, whether it would have denied (else ``None``).

    A tuple underneath: the leased fast path makes one with a single C call.
    """

    __slots__ = ()

    def __new__(
        cls,
        allowed: bool,
        limit: int,
        remaining: int,
        reset_at_ms: int,
        retry_after_ms: int = 0,
        degraded: bool = False,
        leased: bool = False,
        replica: bool = False,
        blocked: bool = False,
        shadow_denied: Optional[bool] = None,
    ) -> "Answer":
        return tuple.__new__(
            cls,
            (allowed, limit, remaining, reset_at_ms, retry_after_ms, degraded, leased, replica, blocked, shadow_denied),
        )

    allowed: bool = property(itemgetter(0))  # type: ignore[assignment]
    limit: int = property(itemgetter(1))  # type: ignore[assignment]
    remaining: int = property(itemgetter(2))  # type: ignore[assignment]
    reset_at_ms: int = property(itemgetter(3))  # type: ignore[assignment]
    retry_after_ms: int = property(itemgetter(4))  # type: ignore[assignment]
    degraded: bool = property(itemgetter(5))  # type: ignore[assignment]
    leased: bool = property(itemgetter(6))  # type: ignore[assignment]
    replica: bool = property(itemgetter(7))  # type: ignore[assignment]
    blocked: bool = property(itemgetter(8))  # type: ignore[assignment]
    shadow_denied: Optional[bool] = property(itemgetter(9))  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return bool(self[0])

    def replace(self, **changes: Any) -> "Answer":
        """A copy with ``changes``."""
        values = dict(zip(_FIELDS, self))
        values.update(changes)
        return Answer(**values)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={v!r}" for f, v in zip(_FIELDS, self))
        return f"Answer({fields})"

    def to_dict(self) -> Dict[str, Any]:
        """The answer as the HTTP API's JSON writes it."""
        d = dict(zip(_FIELDS, self))
        if d["shadow_denied"] is None:
            del d["shadow_denied"]
        return d


class AllAnswer:
    """An all-or-nothing check's answer (the HTTP API's ``POST /v1/check/all``): ``allowed``
    when every enforced check admitted; ``binding`` the index of the limit that binds (when
    denied, the denying check with the longest wait; when admitted, the enforced check with the
    least remaining); ``results`` one answer per check, in order (after a denial they read as if
    the request never came); ``degraded`` when any was answered without its owner."""

    __slots__ = ("allowed", "binding", "results", "degraded")

    def __init__(self, allowed: bool, binding: int, results: List[Answer], degraded: bool) -> None:
        self.allowed = allowed
        self.binding = binding
        self.results = results
        self.degraded = degraded

    @property
    def binding_answer(self) -> Answer:
        """The binding limit's answer (what a single check's headers would report)."""
        return self.results[self.binding]

    def __bool__(self) -> bool:
        return self.allowed

    def __repr__(self) -> str:
        return (
            f"AllAnswer(allowed={self.allowed!r}, binding={self.binding!r}, "
            f"degraded={self.degraded!r}, results={self.results!r})"
        )


def binding(results: List[Answer], shadow: List[bool]) -> int:
    """The index of the binding limit (core's ``all_or_nothing::binding``): when denied, the
    denying enforced check with the longest wait (the last of equals); when admitted, the
    enforced check with the least remaining (the first of equals); shadow checks only when
    every check is one."""
    allowed = all(a.allowed for a in results)

    def pick(enforced_only: bool) -> Optional[int]:
        best: Optional[int] = None
        for i, a in enumerate(results):
            if enforced_only and shadow[i]:
                continue
            if allowed:
                if best is None or a.remaining < results[best].remaining:
                    best = i
            elif not a.allowed:
                if best is None or a.retry_after_ms >= results[best].retry_after_ms:
                    best = i
        return best

    found = pick(True)
    if found is None:
        found = pick(False)
    return found if found is not None else 0
