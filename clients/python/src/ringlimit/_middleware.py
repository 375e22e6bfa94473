"""What the ASGI and WSGI middleware share: the limit a request is held to, the answer's
headers, the bodies of a 429, a 503 and a 500 (the HTTP API's error shape)."""

from __future__ import annotations

import json
import logging
from typing import Any, List, Optional, Tuple, Union

from ._rules import Inline, resolve_inline
from .answers import Answer
from .errors import InvalidCheck, RingLimitError, Unavailable
from .headers import headers_for, retry_after_secs

log = logging.getLogger("ringlimit")


class Limit:
    """A middleware's limit: a rule's name, an :class:`Inline` rule, or ``limit`` per
    ``period_ms`` (an inline token bucket), and the cost a request takes."""

    def __init__(
        self,
        rule: Optional[Union[str, Inline]] = None,
        limit: Optional[int] = None,
        period_ms: Optional[int] = None,
        cost: int = 1,
    ) -> None:
        if (rule is None) == (limit is None):
            raise ValueError("give the middleware either `rule` or `limit` and `period_ms`")
        if limit is not None and period_ms is None:
            raise ValueError("an inline limit needs `period_ms`")
        self.rule = rule
        self.limit = limit
        self.period_ms = period_ms
        self.cost = cost
        inline = rule if isinstance(rule, Inline) else (Inline(limit, period_ms) if limit is not None else None)  # type: ignore[arg-type]
        self._resolved = resolve_inline(inline) if inline is not None else None

    def policy(self, client: Any) -> Tuple[str, int]:
        """The limit's name in the IETF fields and its period in ms (0 while unknown)."""
        if self._resolved is not None:
            return self._resolved.policy_name, self._resolved.period_ms
        assert isinstance(self.rule, str)
        return self.rule, client.period_ms(self.rule) or 0

    def headers(self, client: Any, answer: Answer) -> List[Tuple[str, str]]:
        name, period_ms = self.policy(client)
        return headers_for([(name, period_ms, answer)], answer)


def denied_body(answer: Answer) -> bytes:
    s = retry_after_secs(answer)
    return json.dumps({"error": "rate_limited", "message": f"Too many requests; retry after {s} s."}).encode()


def error_response(err: RingLimitError) -> Tuple[int, List[Tuple[str, str]], bytes]:
    """A check that raised: 503 while a fail-closed client has no cluster, else the
    endpoint's limit is misconfigured (the service's fault, not the caller's): 500."""
    if isinstance(err, Unavailable):
        body = {"error": "unavailable", "message": f"The rate limiter is unavailable: {err.message}."}
        return 503, [("Content-Type", "application/json"), ("Retry-After", "1")], json.dumps(body).encode()
    log.error("ringlimit: rate limit check refused: %s", err)
    body = {"error": "rate_limit_misconfigured", "message": "The rate limit of this endpoint is misconfigured."}
    return 500, [("Content-Type", "application/json")], json.dumps(body).encode()


__all__ = ["Limit", "denied_body", "error_response", "InvalidCheck"]
