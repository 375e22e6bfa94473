"""The errors a client raises: mistakes in a check, with the nodes' own error codes.

An owner that is slow or unreachable is never an error for a check: the client answers from its
local fallback and marks the answer ``degraded`` (unless it was built ``fail_open=False``). What
raises is a check that no node would accept (a bad key, an unknown rule, an invalid inline
rule, a cost above the rule's capacity), with the code the HTTP API and ringlimit.v1 use.
"""

from __future__ import annotations

from typing import Optional


class RingLimitError(Exception):
    """Base of every error of this package: ``code`` is the nodes' snake_case error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class InvalidCheck(RingLimitError, ValueError):
    """A check no node would accept: ``invalid_key``, ``invalid_limit``, ``invalid_period``,
    ``invalid_burst``, ``invalid_cost``, ``unknown_algorithm``, ``invalid_request``,
    ``invalid_batch``, ``duplicate_check``."""


class UnknownRule(InvalidCheck):
    """A named rule the cluster does not have (``unknown_rule``)."""


class Unavailable(RingLimitError):
    """No answer could be made: a reservation without a reachable owner, or a check of a
    client built ``fail_open=False`` whose owner did not answer (``unavailable``)."""


class UnknownReservation(RingLimitError):
    """A settle of a reservation that expired, was settled already or was never issued
    (``unknown_reservation``)."""


class Unauthenticated(RingLimitError):
    """The node wants a client credential (``token=``) for this call, or refused the one given."""


def from_code(code: str, message: str) -> RingLimitError:
    """The error class for a node's code."""
    if code == "unknown_rule":
        return UnknownRule(code, message)
    if code == "unknown_reservation":
        return UnknownReservation(code, message)
    if code in ("unavailable", "too_many_reservations"):
        return Unavailable(code, message)
    if code in ("unauthorized", "forbidden", "unauthenticated", "permission_denied"):
        return Unauthenticated(code, message)
    return InvalidCheck(code, message)


def from_status_message(details: Optional[str], fallback_code: str) -> RingLimitError:
    """A gRPC status message ``"<code>: <sentence>"`` as an error (``fallback_code`` when the
    message carries none)."""
    text = details or ""
    code, sep, sentence = text.partition(": ")
    if sep and code and all(c.islower() or c == "_" for c in code):
        return from_code(code, sentence)
    return from_code(fallback_code, text)
