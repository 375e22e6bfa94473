"""The asyncio client: :class:`Client`, the same as :class:`ringlimit.Client` with ``await``.

Checks travel over ``grpc.aio`` channels, one per member, coalesced per owner as the
synchronous client does (whatever is queued while a call to an owner is in flight goes as the
next ``CheckBatch``). The topology watch and the leases' asks run on the engine's threads, so a
leased check never waits on the event loop's other work. ``check_all``, ``reserve`` and
``settle`` run the synchronous client's code on the default executor (they are a few calls per
request, not the hot path). Use one client per event loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import grpc
import grpc.aio

from . import client as _sync
from ._core import (
    MAX_BATCH,
    Core,
    Failure,
    Outcome,
    Settings,
    answer_of,
    outcome_of_error,
    outcomes_of_batch,
    outcomes_of_stream,
)
from ._leases import Entry
from ._rules import Inline
from ._stream import AioCheckStream, NotSent, refused
from ._tls import aio_channel
from .answers import AllAnswer, Answer
from .v1 import ratelimiter_pb2 as pb
from .v1 import ratelimiter_pb2_grpc as pb_grpc

_mono = time.monotonic_ns
_new = tuple.__new__
_TIMED_OUT = Failure("owner did not answer within the deadline")


def _expire(fut: "asyncio.Future[Outcome]") -> None:
    if not fut.done():
        fut.set_result(_TIMED_OUT)


class _Batcher:
    def __init__(self, client: "Client", addr: str) -> None:
        self.client = client
        self.addr = addr
        self.queue: List[Tuple[Any, "asyncio.Future[Outcome]"]] = []
        self.busy = False

    def submit(self, req: Any, fut: "asyncio.Future[Outcome]") -> None:
        self.queue.append((req, fut))
        if not self.busy:
            self.busy = True
            asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        client = self.client
        core = client._core
        try:
            while self.queue:
                batch = self.queue[:MAX_BATCH]
                del self.queue[:MAX_BATCH]
                reqs = [r for r, _ in batch]
                core.stats.batches += 1
                core.stats.checks_sent += len(batch)
                outs: Optional[List[Outcome]] = None
                st = client._stream(self.addr)
                if st is not None:
                    try:
                        outs = outcomes_of_stream(await st.ask(reqs, core.s.deadline_s), len(batch))
                        core.stats.streamed += 1
                    except asyncio.TimeoutError:
                        outs = [_TIMED_OUT] * len(batch)
                    except NotSent:
                        pass  # never decided: the unary call below decides them
                    except Exception as e:  # the stream broke, or the node does not take it
                        if refused(e):
                            # Never decided: the unary call below decides them (and from now on).
                            client._unary_only.add(self.addr)
                        else:
                            outs = [outcome_of_error(e, False)] * len(batch)
                if outs is None:
                    outs = await self._unary(reqs)
                for i, (_, fut) in enumerate(batch):
                    if not fut.done():
                        fut.set_result(outs[i] if i < len(outs) else Failure("owner answered too few checks"))
        finally:
            self.busy = False

    async def _unary(self, reqs: List[Any]) -> List[Outcome]:
        core = self.client._core
        try:
            stub = self.client._stub(self.addr)
            if len(reqs) == 1:
                resp = await stub.Check(reqs[0], timeout=core.s.deadline_s, metadata=core.s.metadata)
                return [answer_of(resp)]
            req = pb.CheckBatchRequest(checks=reqs)
            resp = await stub.CheckBatch(req, timeout=core.s.deadline_s, metadata=core.s.metadata)
            return list(outcomes_of_batch(resp))
        except Exception as e:  # transport trouble: every check of the batch falls back
            return [outcome_of_error(e, len(reqs) == 1)] * len(reqs)


class AsyncReservation:
    """A reservation (see :meth:`Client.reserve`); ``async with`` settles on exit at
    ``cost`` (set it to the actual cost; default the estimate)."""

    def __init__(self, inner: _sync.Reservation) -> None:
        self._inner = inner

    @property
    def allowed(self) -> bool:
        return self._inner.allowed

    @property
    def answer(self) -> Answer:
        return self._inner.answer

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def estimate(self) -> int:
        return self._inner.estimate

    @property
    def cost(self) -> int:
        return self._inner.cost

    @cost.setter
    def cost(self, value: int) -> None:
        self._inner.cost = value

    async def settle(self, actual: Optional[int] = None) -> Answer:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._inner.settle, actual)

    async def __aenter__(self) -> "AsyncReservation":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._inner.__exit__, *exc)


class _Reserving:
    """``await client.reserve(...)`` or ``async with client.reserve(...) as r``."""

    def __init__(self, client: "Client", args: Tuple[Any, ...]) -> None:
        self._client = client
        self._args = args
        self._r: Optional[AsyncReservation] = None

    async def _get(self) -> AsyncReservation:
        if self._r is None:
            loop = asyncio.get_running_loop()
            inner = await loop.run_in_executor(None, lambda: self._client._sync.reserve(*self._args))
            self._r = AsyncReservation(inner)
        return self._r

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._get().__await__()

    async def __aenter__(self) -> AsyncReservation:
        return await self._get()

    async def __aexit__(self, *exc: Any) -> None:
        if self._r is not None:
            await self._r.__aexit__(*exc)


class Client:
    """The asyncio twin of :class:`ringlimit.Client` (same arguments and answers). Discovery
    runs in the background: ``await client.ready()`` (or ``async with``) waits for it,
    bounded; checks before it are answered by the fallback."""

    def __init__(self, seeds: Sequence[str], token: Optional[str] = None, **settings: Any) -> None:
        self._core = core = Core(Settings(seeds, token, **settings))
        self._channels: Dict[str, grpc.aio.Channel] = {}
        self._stubs: Dict[str, pb_grpc.RateLimiterStub] = {}
        self._batchers: Dict[str, _Batcher] = {}
        #: The check stream per owner channel, and the addresses that do not take one.
        self._streams: Dict[str, AioCheckStream] = {}
        self._unary_only: Set[str] = set()
        self._dead: List[grpc.aio.Channel] = []
        self._version = 0
        core.on_links_changed.append(self._links_changed)
        self._cache = core.cache
        self._leases = core.s.leases
        self._fast_lock = core.fast_lock
        # The synchronous client's code over this engine, for check_all and reservations.
        self._sync = _sync.Client.__new__(_sync.Client)
        self._sync._core = core
        self._sync._batchers = {}
        self._sync._cache = core.cache
        self._sync._leases = core.s.leases
        self._sync._fast_lock = core.fast_lock
        core.start(discover_now=False)

    def _links_changed(self, topo: Any) -> None:
        # Runs on the topology thread: only swaps references (the loop drops stale stubs).
        self._cache = self._core.cache
        self._sync._cache = self._core.cache

    def _stub(self, addr: str) -> pb_grpc.RateLimiterStub:
        stub = self._stubs.get(addr)
        if stub is None:
            ch = aio_channel(addr, self._core.s.tls)
            self._channels[addr] = ch
            stub = self._stubs[addr] = pb_grpc.RateLimiterStub(ch)
        return stub

    def _stream(self, addr: str) -> Optional[AioCheckStream]:
        """The check stream to ``addr``, opened when there is none or the last one broke;
        ``None`` where ``addr`` does not take one."""
        if addr in self._unary_only:
            return None
        st = self._streams.get(addr)
        if st is not None and st.broken is None:
            return st
        st = self._streams[addr] = AioCheckStream(self._stub(addr), self._core.s.metadata)
        self._core.stats.streams_opened += 1
        return st

    async def ready(self, timeout: float = 5.0) -> bool:
        """Waits (at most ``timeout`` s) until a node has answered once."""
        if self._core.ready.is_set():
            return True
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._core.ready.wait, timeout)

    async def check(
        self,
        key: str,
        rule: Optional[Union[str, Inline]] = None,
        limit: Optional[int] = None,
        period_ms: Optional[int] = None,
        cost: int = 1,
    ) -> Answer:
        """See :meth:`ringlimit.Client.check`."""
        keys = self._cache.get(rule if limit is None else (limit, period_ms))
        if keys is not None:
            e = keys.get(key)
            if e is not None:
                it = e.it
                if it is not None and cost == 1 and _mono() < e.until and self._fast_lock is None:
                    r = next(it, -1)
                    if r >= 0:
                        if r < e.low:
                            self._core.lease_low(e)
                        return _new(Answer, (True, e.limit, r + e.queued, e.reset_at_ms, 0, False, True, False, False, None))
                return await self._check(e, cost)
        core = self._core
        spec = rule if limit is None else (limit, period_ms)
        if isinstance(rule, str) and core.topo.rules is not None and rule not in core.topo.rules:
            # An unknown name refetches the rules (a blocking call): off the loop.
            loop = asyncio.get_running_loop()
            got = await loop.run_in_executor(None, core.entry, spec, key, rule, limit, period_ms)
        else:
            got = core.entry(spec, key, rule, limit, period_ms)
        if isinstance(got, Answer):
            return got
        return await self._check(got, cost)

    async def _check(self, e: Entry, cost: int) -> Answer:
        core = self._core
        core.check_cost(e, cost)
        if self._leases:
            leased = core.lease_path(e, cost)
            if leased is not None:
                return leased
        addr = core.route(e)
        if addr is None:
            return core.fall_back(e, Failure("no cluster member alive") if core.topo.members else None, cost)
        if self._version != core.topo.version:
            self._prune()
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[Outcome]" = loop.create_future()
        timer = loop.call_later(core.s.deadline_s, _expire, fut)
        b = self._batchers.get(addr)
        if b is None:
            b = self._batchers[addr] = _Batcher(self, addr)
        b.submit(core.request(e, cost), fut)
        got = await fut
        timer.cancel()
        return core.resolve(e, got, cost)

    def _prune(self) -> None:
        """Members gone from the topology: their channels are closed at :meth:`close` (calls
        in flight on them end first)."""
        core = self._core
        self._version = core.topo.version
        live = set(core.topo.grpc_addrs())
        for addr in [a for a in self._channels if a not in live]:
            self._dead.append(self._channels.pop(addr))
            self._stubs.pop(addr, None)
            self._batchers.pop(addr, None)
            self._unary_only.discard(addr)
            st = self._streams.pop(addr, None)
            if st is not None:
                st.abort()

    async def check_all(self, checks: Iterable[Any]) -> AllAnswer:
        """See :meth:`ringlimit.Client.check_all`."""
        items = list(checks)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._sync.check_all, items)

    def reserve(
        self,
        key: str,
        rule: Optional[Union[str, Inline]] = None,
        limit: Optional[int] = None,
        period_ms: Optional[int] = None,
        estimate: int = 1,
        ttl_ms: Optional[int] = None,
    ) -> _Reserving:
        """See :meth:`ringlimit.Client.reserve`: ``r = await client.reserve(...)`` or
        ``async with client.reserve(...) as r: ...`` (settles on exit at ``r.cost``)."""
        return _Reserving(self, (key, rule, limit, period_ms, estimate, ttl_ms))

    async def settle(self, reservation: str, cost: int) -> Answer:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._sync.settle, reservation, cost)

    def members(self) -> List[str]:
        return self._sync.members()

    def period_ms(self, rule: Any) -> Optional[int]:
        return self._sync.period_ms(rule)

    def stats(self) -> Dict[str, int]:
        return self._sync.stats()

    async def close(self) -> None:
        """Gives back what leases hold, stops the threads, closes the channels."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._core.close)
        for st in self._streams.values():
            st.abort()
        self._streams.clear()
        for ch in list(self._channels.values()) + self._dead:
            await ch.close()
        self._channels.clear()
        self._stubs.clear()
        self._dead.clear()

    async def __aenter__(self) -> "Client":
        await self.ready(max(self._core.s.discovery_timeout_s * 2, 1.0))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
