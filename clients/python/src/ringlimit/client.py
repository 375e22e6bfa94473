"""The synchronous client (threads): :class:`Client`."""

from __future__ import annotations

import threading
import time
from _thread import allocate_lock
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import grpc

from ._core import (
    MAX_BATCH,
    Core,
    Failure,
    Outcome,
    Settings,
    as_check,
    answer_of,
    outcome_of_error,
    outcomes_of_batch,
    outcomes_of_stream,
    shadowed,
)
from ._fallback import Taken
from ._leases import Entry
from ._rules import Inline
from ._stream import CheckStream, refused
from .answers import AllAnswer, Answer, binding
from .errors import InvalidCheck, RingLimitError, Unavailable, from_status_message
from .v1 import ratelimiter_pb2 as pb

_mono = time.monotonic_ns
_new = tuple.__new__
#: A check its owner did not answer in time (the fallback's reason).
_TIMED_OUT = Failure("owner did not answer within the deadline")

#: Most checks in one all-or-nothing request.
MAX_ALL = 32


class Check(NamedTuple):
    """One check of :meth:`Client.check_all`: ``key`` under ``rule`` (a name or an
    :class:`Inline`) or an inline ``limit`` per ``period_ms``, taking ``cost``."""

    key: str
    rule: Optional[Union[str, Inline]] = None
    limit: Optional[int] = None
    period_ms: Optional[int] = None
    cost: int = 1


class _Pending:
    """A check waiting for its owner: the caller blocks on ``done`` (released by the RPC's
    callback) no longer than its deadline."""

    __slots__ = ("req", "done", "got")

    def __init__(self, req: Any) -> None:
        self.req = req
        self.done = allocate_lock()
        self.done.acquire()
        self.got: Optional[Outcome] = None

    def settle(self, got: Outcome) -> None:
        self.got = got
        self.done.release()


class _Batcher:
    """Coalesces the checks for one owner: one request in flight at a time; whatever is queued
    while it flies goes as the next request (no fixed wait). Requests travel on the owner's
    check stream (:class:`ringlimit._stream.CheckStream`), or as ``Check``/``CheckBatch``
    calls where the owner does not take one."""

    def __init__(self, core: Core, addr: str) -> None:
        self.core = core
        self.addr = addr
        self.lock = threading.Lock()
        self.queue: List[_Pending] = []
        self.busy = False
        #: The request in flight on a stream, and when it was sent: unanswered past the
        #: deadline, the stream is aborted (its checks fall back, the next request reopens it).
        self.flying: Optional[Tuple[CheckStream, int]] = None
        self.deadline_ns = int(core.s.deadline_s * 1e9)

    def submit(self, p: _Pending) -> None:
        stale: Optional[CheckStream] = None
        with self.lock:
            if not self.busy and not self.queue:
                self.busy = True
                alone = True
            else:
                self.queue.append(p)
                if self.busy:
                    f = self.flying
                    if f is not None and _mono() - f[1] > self.deadline_ns:
                        stale = f[0]
                    alone = False
                    batch = None
                else:
                    self.busy = True
                    alone = False
                    batch = self.queue[:MAX_BATCH]
                    del self.queue[:MAX_BATCH]
        if stale is not None:
            stale.abort()
        if alone:
            self._send_alone(p)
        elif batch is not None:
            self._send(batch)

    def _send_alone(self, p: _Pending) -> None:
        """Nothing else in flight: on the stream, as any request; without one, the caller's
        own thread makes the call, blocking (grpcio then needs no completion thread and no
        hand-over to the caller); what queues meanwhile goes next from here, without
        waiting for it."""
        st = self.core.stream(self.addr)
        if st is not None and self._stream_send(st, [p]):
            return
        core = self.core
        core.stats.batches += 1
        core.stats.checks_sent += 1
        try:
            got: Outcome = answer_of(
                core.stub(self.addr).Check(p.req, timeout=core.s.deadline_s, metadata=core.s.metadata)
            )
        except Exception as e:  # an RPC error, or a closed channel: see outcome_of_error
            timed_out = isinstance(e, grpc.RpcError) and getattr(e, "code", None) is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            got = _TIMED_OUT if timed_out else outcome_of_error(e, True)
        p.settle(got)
        self._next()

    def _send(self, batch: List[_Pending]) -> None:
        st = self.core.stream(self.addr)
        if st is not None and self._stream_send(st, batch):
            return
        self._send_unary(batch)

    def _stream_send(self, st: CheckStream, batch: List[_Pending]) -> bool:
        """Sends ``batch`` on ``st``; False when it broke meanwhile (nothing was sent)."""
        self.flying = (st, _mono())
        if not st.send([p.req for p in batch], lambda resp, err: self._streamed(batch, resp, err)):
            self.flying = None
            return False
        stats = self.core.stats
        stats.batches += 1
        stats.checks_sent += len(batch)
        return True

    def _streamed(self, batch: List[_Pending], resp: Any, error: Optional[BaseException]) -> None:
        """The stream answered ``batch`` (``resp``), or broke with ``error``."""
        self.flying = None
        if error is not None and refused(error):
            # The node never decided them: unary calls do (and from now on).
            self.core.stream_refused(self.addr, error)
            self._send_unary(batch)
            return
        try:
            if error is None:
                self.core.stats.streamed += 1
                outs = outcomes_of_stream(resp, len(batch))
            else:
                outs = [outcome_of_error(error, False)] * len(batch)
            for i, p in enumerate(batch):
                p.settle(outs[i] if i < len(outs) else Failure("owner answered too few checks"))
        except Exception as e:  # never leave a caller without an outcome
            for p in batch:
                if p.got is None:
                    p.settle(Failure(f"owner unreachable ({type(e).__name__})"))
        self._next()

    def _send_unary(self, batch: List[_Pending]) -> None:
        core = self.core
        core.stats.batches += 1
        core.stats.checks_sent += len(batch)
        try:
            stub = core.stub(self.addr)
            if len(batch) == 1:
                fut = stub.Check.future(batch[0].req, timeout=core.s.deadline_s, metadata=core.s.metadata)
            else:
                req = pb.CheckBatchRequest(checks=[p.req for p in batch])
                fut = stub.CheckBatch.future(req, timeout=core.s.deadline_s, metadata=core.s.metadata)
        except Exception as e:  # a closed channel: the checks fall back
            self._done(batch, None, e)
            return
        fut.add_done_callback(lambda f: self._done(batch, f, None))

    def _done(self, batch: List[_Pending], fut: Any, error: Optional[BaseException]) -> None:
        try:
            if error is None:
                error = fut.exception()
            if error is not None:
                got = outcome_of_error(error, len(batch) == 1)
                for p in batch:
                    p.settle(got)
            elif len(batch) == 1:
                batch[0].settle(answer_of(fut.result()))
            else:
                results = outcomes_of_batch(fut.result())
                for i, p in enumerate(batch):
                    p.settle(results[i] if i < len(results) else Failure("owner answered too few checks"))
        except Exception as e:  # never leave a caller without an outcome
            for p in batch:
                if p.got is None:
                    p.settle(Failure(f"owner unreachable ({type(e).__name__})"))
        self._next()

    def _next(self) -> None:
        """The call in flight ended: sends what queued meanwhile, or marks the owner idle."""
        with self.lock:
            if not self.queue:
                self.busy = False
                return
            batch = self.queue[:MAX_BATCH]
            del self.queue[:MAX_BATCH]
        self._send(batch)


class Reservation:
    """A reservation (see :meth:`Client.reserve`): ``allowed`` when the estimate was taken
    (``answer`` the check's answer to it). A context manager: on exit it settles at
    ``cost`` (set it to the actual cost; default the estimate). ``settle(actual)`` settles
    explicitly; a reservation settles once."""

    def __init__(self, client: "Client", entry: Optional[Entry], rid: str, estimate: int, answer: Answer) -> None:
        self._client = client
        self._entry = entry
        self.id = rid
        self.estimate = estimate
        self.cost = estimate
        self.answer = answer
        self.allowed = answer.allowed and bool(rid)
        self.settled: Optional[Answer] = None

    def settle(self, actual: Optional[int] = None) -> Answer:
        """Settles at ``actual`` (default ``cost``): the bucket's answer afterwards (in debt,
        ``allowed`` false until repaid)."""
        if not self.allowed:
            raise InvalidCheck("unknown_reservation", "a denied reservation holds nothing to settle")
        if self.settled is not None:
            return self.settled
        cost = self.cost if actual is None else actual
        self.settled = self._client._settle(self._entry, self.id, cost)
        return self.settled

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.allowed and self.settled is None:
            try:
                self.settle()
            except RingLimitError:
                if exc[0] is None:
                    raise


class Client:
    """A ringlimit client: routes each check straight to its key's owner over gRPC
    (ringlimit.v1), coalescing concurrent checks per owner; falls back to a local share of the
    limit (``degraded``) when the owner does not answer within ``deadline_ms``; with
    ``leases=True`` decides hot keys' checks in process on slices leased from their owners.

    ``seeds``: nodes' ``http://host:port`` (HTTP API) or ``grpc://host:port`` (ringlimit.v1)
    addresses; ``https://host:port`` for nodes with ``--tls-cert``. ``token``: a client
    credential (sent as ``authorization: Bearer``). TLS: an ``https://`` seed, ``tls_ca`` (the
    CA of the nodes' certificates: a PEM file's path, or the PEM as bytes; the system's roots
    when not given) or ``tls_server_name`` (the name every member's certificate is checked
    against, when members are dialed by IP and certificates name a host) makes every channel
    and discovery request TLS; http:// and https:// seeds together are refused. See
    :class:`ringlimit._core.Settings` for the other settings (``deadline_ms``,
    ``fail_open``, ``fallback_fraction``, ``cluster_id``, ``grpc_addrs``, ``hot_keys_rate``:
    the checks a second at which a key is leased, 1,000 by default...). Discovery is
    bounded: an unreachable cluster leaves the client degraded, never failed.
    """

    def __init__(self, seeds: Sequence[str], token: Optional[str] = None, **settings: Any) -> None:
        self._core = core = Core(Settings(seeds, token, **settings))
        self._batchers: Dict[str, _Batcher] = {}
        core.on_links_changed.append(self._links_changed)
        core.start(discover_now=True)
        self._cache = core.cache
        self._leases = core.s.leases
        self._fast_lock = core.fast_lock

    def _links_changed(self, topo: Any) -> None:
        self._cache = self._core.cache
        live = set(topo.grpc_addrs())
        for addr in list(self._batchers):
            if addr not in live:
                self._batchers.pop(addr, None)

    def check(
        self,
        key: str,
        rule: Optional[Union[str, Inline]] = None,
        limit: Optional[int] = None,
        period_ms: Optional[int] = None,
        cost: int = 1,
    ) -> Answer:
        """May ``key`` spend ``cost`` under ``rule`` (a rule's name, or an :class:`Inline`) or
        an inline token bucket of ``limit`` per ``period_ms``? Never raises for an owner that
        is slow or unreachable (the answer is then ``degraded``); raises
        :class:`ringlimit.InvalidCheck` (``UnknownRule``...) for a check no node would accept."""
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
                return self._check(e, cost)
        got = self._core.entry(rule if limit is None else (limit, period_ms), key, rule, limit, period_ms)
        if isinstance(got, Answer):
            return got
        return self._check(got, cost)

    def _check(self, e: Entry, cost: int) -> Answer:
        core = self._core
        core.check_cost(e, cost)
        if self._leases:
            leased = core.lease_path(e, cost)
            if leased is not None:
                return leased
        addr = core.route(e)
        if addr is None:
            return core.fall_back(e, Failure("no cluster member alive") if core.topo.members else None, cost)
        p = _Pending(core.request(e, cost))
        self._batcher(addr).submit(p)
        if not p.done.acquire(timeout=core.s.deadline_s):
            return core.fall_back(e, _TIMED_OUT, cost)
        return core.resolve(e, p.got, cost)  # type: ignore[arg-type]

    def _batcher(self, addr: str) -> _Batcher:
        b = self._batchers.get(addr)
        if b is None:
            b = self._batchers.setdefault(addr, _Batcher(self._core, addr))
        return b

    def _prepare(self, key: Any, rule: Any, limit: Any, period_ms: Any) -> Entry:
        spec = rule if limit is None else (limit, period_ms)
        got = self._core.entry(spec, key, rule, limit, period_ms)
        if isinstance(got, Answer):
            raise Unavailable("unavailable", "no cluster member reached yet: the rule is not known")
        return got

    def check_all(self, checks: Iterable[Any]) -> AllAnswer:
        """Decides one request against all ``checks`` (1 to 32 :class:`Check`, mappings or
        ``(key, rule)`` tuples), all-or-nothing: admitted only when every enforced limit
        admits; when any denies, none keeps its cost (each owner held what it admitted, and is
        given it back). An owner that does not answer is replaced by the fallback share."""
        items = [as_check(c) for c in checks]
        if not 1 <= len(items) <= MAX_ALL:
            raise InvalidCheck("invalid_batch", f"`checks` must hold 1 to {MAX_ALL} checks, got {len(items)}")
        core = self._core
        entries: List[Entry] = []
        costs: List[int] = []
        for i, (key, rule, limit, period_ms, cost) in enumerate(items):
            try:
                e = self._prepare(key, rule, limit, period_ms)
                core.check_cost(e, cost)
            except RingLimitError as err:
                raise type(err)(err.code, f"check {i}: {err.message}") from None
            entries.append(e)
            costs.append(cost)
        seen: Dict[int, int] = {}
        for i, e in enumerate(entries):
            if e.id in seen:
                raise InvalidCheck(
                    "duplicate_check",
                    f"checks {seen[e.id]} and {i} name the same bucket (same rule and key); "
                    "give it once with the summed `cost`",
                )
            seen[e.id] = i
        n = len(entries)
        results: List[Optional[Answer]] = [None] * n
        taken: List[Optional[Taken]] = [None] * n
        groups: Dict[str, List[int]] = {}
        for i, e in enumerate(entries):
            addr = core.route(e)
            if addr is None:
                results[i], taken[i] = core.fall_back_held(e, costs[i])
            else:
                groups.setdefault(addr, []).append(i)
        calls: List[Tuple[str, List[int], Any, Optional[BaseException]]] = []
        for addr, idx in groups.items():
            reqs = [core.request(entries[i], costs[i], hold=True) for i in idx]
            core.stats.batches += 1
            core.stats.checks_sent += len(reqs)
            try:
                fut = core.stub(addr).CheckBatch.future(
                    pb.CheckBatchRequest(checks=reqs), timeout=core.s.deadline_s, metadata=core.s.metadata
                )
            except Exception as closed:  # a closed channel
                calls.append((addr, idx, None, closed))
                continue
            calls.append((addr, idx, fut, None))
        holds: List[Tuple[int, Any]] = []
        for addr, idx, fut, failed in calls:
            outcomes: List[Outcome]
            if fut is not None:
                try:
                    resp = fut.result(timeout=core.s.deadline_s + 0.05)
                    outcomes = list(outcomes_of_batch(resp))
                    # Marks of the holds, in the owner's answers.
                    for i, r in zip(idx, resp.results):
                        if r.WhichOneof("result") == "answer" and r.answer.HasField("hold"):
                            holds.append((i, r.answer.hold))
                except grpc.FutureTimeoutError:
                    fut.cancel()
                    outcomes = [Failure("owner did not answer within the deadline")] * len(idx)
                except grpc.RpcError as rpc:
                    outcomes = [outcome_of_error(rpc, False)] * len(idx)
            else:
                outcomes = [Failure(f"owner unreachable ({type(failed).__name__})")] * len(idx)
            for j, i in enumerate(idx):
                got = outcomes[j] if j < len(outcomes) else Failure("owner answered too few checks")
                if isinstance(got, Answer):
                    core.stats.direct += 1
                    results[i] = got
                elif isinstance(got, RingLimitError) and not (got.code == "unknown_rule" and entries[i].rule.name):
                    self._undo(entries, costs, holds, taken)
                    raise type(got)(got.code, f"check {i}: {got.message}")
                else:
                    if isinstance(got, Failure) and got.code == grpc.StatusCode.UNAVAILABLE:
                        core.down_until[addr] = core.clock() + 250_000_000
                    core.ask_refresh()
                    if not core.s.fail_open:
                        self._undo(entries, costs, holds, taken)
                        raise Unavailable("unavailable", f"check {i}: owner unreachable")
                    results[i], taken[i] = core.fall_back_held(entries[i], costs[i])
        final: List[Answer] = []
        shadow: List[bool] = []
        for i, a in enumerate(results):
            assert a is not None
            rule = entries[i].rule
            final.append(shadowed(a, rule) if a.degraded else a)
            shadow.append(rule.shadow)
        admitted = all(a.allowed for a in final)
        if not admitted:
            held_idx = self._undo(entries, costs, holds, taken)
            for i in set(held_idx):
                a = final[i]
                if a.allowed:
                    # Given back: it reads as if the request never came.
                    final[i] = a.replace(remaining=a.remaining + costs[i])
        return AllAnswer(admitted, binding(final, shadow), final, any(a.degraded for a in final))

    def _undo(
        self, entries: List[Entry], costs: List[int], holds: List[Tuple[int, Any]], taken: List[Optional[Taken]]
    ) -> List[int]:
        """Gives back what an all-or-nothing request took: each owner's holds, the fallback's
        takes. Returns the indexes given back."""
        core = self._core
        by_addr: Dict[str, List[Any]] = {}
        back: List[int] = []
        for i, mark in holds:
            e = entries[i]
            item = pb.GiveBackItem(key=e.key, tokens=costs[i], mark=mark)
            e.rule.fill(item)
            addr = e.addr or core.topo.route(e.id)
            if addr is not None:
                by_addr.setdefault(addr, []).append(item)
                back.append(i)
        core.give_back(by_addr)
        for i, t in enumerate(taken):
            if t is not None:
                core.fallback.refund(entries[i].rule, t, core.topo.alive())
                back.append(i)
        return back

    def reserve(
        self,
        key: str,
        rule: Optional[Union[str, Inline]] = None,
        limit: Optional[int] = None,
        period_ms: Optional[int] = None,
        estimate: int = 1,
        ttl_ms: Optional[int] = None,
    ) -> Reservation:
        """Reserves ``estimate`` of ``key``'s bucket at its owner, for costs known afterwards
        (an LLM call's tokens); settle it with the actual cost (``with`` settles on exit at
        ``reservation.cost``). Denied: ``allowed`` false, nothing kept. Reservations live at
        the owner and never fall back: without a reachable owner, :class:`ringlimit.Unavailable`."""
        core = self._core
        e = self._prepare(key, rule, limit, period_ms)
        core.check_cost(e, estimate)
        addr = core.topo.route(e.id)
        if addr is None:
            core.ask_refresh()
            raise Unavailable("unavailable", "no cluster member alive")
        req = pb.ReserveRequest(check=core.request(e, estimate))
        if ttl_ms is not None:
            req.ttl_ms = ttl_ms
        try:
            resp = core.stub(addr).Reserve(req, timeout=core.s.reserve_timeout_s, metadata=core.s.metadata)
        except grpc.RpcError as err:
            got = outcome_of_error(err, True)
            if isinstance(got, RingLimitError):
                raise got from None
            core.ask_refresh()
            raise Unavailable("unavailable", getattr(got, "why", "owner unreachable")) from None
        return Reservation(self, e, resp.reservation, resp.cost, answer_of(resp.answer))

    def _settle(self, e: Optional[Entry], rid: str, cost: int) -> Answer:
        core = self._core
        addr = core.topo.route(e.id) if e is not None else None
        if addr is None:
            addrs = core.topo.grpc_addrs()
            if not addrs:
                raise Unavailable("unavailable", "no cluster member alive")
            addr = addrs[0]
        try:
            resp = core.stub(addr).Settle(
                pb.SettleRequest(reservation=rid, cost=cost),
                timeout=core.s.reserve_timeout_s,
                metadata=core.s.metadata,
            )
        except grpc.RpcError as err:
            got = outcome_of_error(err, True)
            if isinstance(got, RingLimitError):
                raise got from None
            raise Unavailable("unavailable", getattr(got, "why", "owner unreachable")) from None
        return answer_of(resp)

    def settle(self, reservation: str, cost: int) -> Answer:
        """Settles a reservation id (taken by any client or node) at ``cost``."""
        return self._settle(None, reservation, cost)

    # ---- introspection ---------------------------------------------------------------------

    def members(self) -> List[str]:
        """Node ids of the members the client routes to now."""
        return sorted(self._core.topo.members)

    def owner_of(self, key: str, rule: Optional[Union[str, Inline]] = None, limit: Optional[int] = None, period_ms: Optional[int] = None) -> Optional[str]:
        """The member that owns the bucket of ``key`` under the rule now."""
        e = self._prepare(key, rule, limit, period_ms)
        return self._core.topo.ring.owner(e.id)

    def period_ms(self, rule: Union[str, Inline, Tuple[int, int]]) -> Optional[int]:
        """The period in ms of a rule as this client knows it (``None``: not learnt yet)."""
        if isinstance(rule, tuple) and not isinstance(rule, Inline):
            return int(rule[1])
        if isinstance(rule, Inline):
            from ._rules import resolve_inline

            return resolve_inline(rule).period_ms
        rules = self._core.topo.rules or {}
        found = rules.get(rule)
        return found.period_ms if found else None

    def stats(self) -> Dict[str, int]:
        """What this client has done so far: ``direct`` (answered by owners), ``degraded``,
        ``leased`` (decided on slices), ``batches`` and ``checks_sent`` (to owners)..."""
        core = self._core
        with core.leases_lock:
            fast = sum(e.spent() for e in core.held.entries.values()) if self._leases else 0
        d = core.stats.snapshot()
        d["leased_tokens_spent"] = fast
        d["leases_held"] = len(core.held.entries)
        d["fallback_buckets"] = len(core.fallback)
        return d

    def wait_ready(self, timeout: float = 5.0) -> bool:
        """Waits (bounded) until a node has answered once."""
        return self._core.ready.wait(timeout)

    def refresh(self) -> bool:
        """Asks for the topology now (it is kept fresh in the background anyway)."""
        return self._core.discover()

    def close(self) -> None:
        """Gives back what leases hold, stops the background threads, closes connections."""
        self._core.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
