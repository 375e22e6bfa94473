"""ringlimit: a client for ringlimit clusters.

>>> client = ringlimit.Client(seeds=["http://10.0.0.1:8080"])     # doctest: +SKIP
>>> answer = client.check("user:42", rule="free-tier")             # doctest: +SKIP
>>> if not answer.allowed: ...                                     # doctest: +SKIP

Checks go straight to the owner of their key over gRPC, concurrent ones coalesced per owner;
an owner that is slow or unreachable is answered for by a local share of the limit
(``degraded``); ``leases=True`` decides hot keys in process on leased slices.
``ringlimit.aio.Client`` is the same for asyncio; ``ringlimit.asgi`` and ``ringlimit.wsgi``
hold the middleware.
"""

from ._rules import Inline
from .answers import AllAnswer, Answer
from .client import Check, Client, Reservation
from .errors import (
    InvalidCheck,
    RingLimitError,
    Unauthenticated,
    Unavailable,
    UnknownReservation,
    UnknownRule,
)

__version__ = "0.1.0"

__all__ = [
    "AllAnswer",
    "Answer",
    "Check",
    "Client",
    "Inline",
    "InvalidCheck",
    "Reservation",
    "RingLimitError",
    "Unauthenticated",
    "Unavailable",
    "UnknownReservation",
    "UnknownRule",
    "__version__",
]
