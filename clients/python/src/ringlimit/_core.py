"""The client's engine, shared by :class:`ringlimit.Client` and :class:`ringlimit.aio.Client`:
settings, the topology and how it is kept fresh (a thread), the buckets checked (rule and key
to bucket id, cached), routing to owners, the fallback share, and leases (a thread that asks
and gives back). The two clients differ only in how a check travels to its owner."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

import grpc

from . import _hash
from ._fallback import Fallback, Taken
from ._leases import BACKOFF_NS, GIL_GUARDS, PROMOTE_AT, SAMPLE, TICK_NS, Entry, HotKeys, Held
from ._rules import NANOS_PER_MS, Inline, Rule, resolve_inline, validate_key
from ._stream import CheckStream
from ._tls import CaSource, Tls, channel
from ._topology import DiscoveryError, Member, Topology, fetch_http, from_response, grpc_target, http_base
from .answers import Answer
from .errors import InvalidCheck, RingLimitError, UnknownRule, from_status_message
from .v1 import ratelimiter_pb2 as pb
from .v1 import ratelimiter_pb2_grpc as pb_grpc

log = logging.getLogger("ringlimit")

RuleSpec = Union[str, Inline, Tuple[int, int]]

#: A failing owner's checks go to the fallback at once for this long (its circuit is open).
OPEN_FOR_NS = 250 * NANOS_PER_MS
#: Refreshes asked for by failing checks are at most this frequent.
MIN_REFRESH_GAP_NS = 100 * NANOS_PER_MS
#: A check naming a rule the client does not know refetches the topology at most this often.
UNKNOWN_RULE_REFETCH_NS = 250 * NANOS_PER_MS
#: How long an owner may take to answer lease asks and give-backs.
LEASE_WITHIN_S = 0.5
#: How often held slices are looked at (expired ones go back) while any are held.
SWEEP_S = 0.02
#: Most checks in one CheckBatch (ringlimit.v1's bound).
MAX_BATCH = 1000
#: Bounded backoff between attempts to watch the topology.
WATCH_BACKOFF_MIN_S = 0.05
WATCH_BACKOFF_MAX_S = 2.0
#: Transport failures: the owner did not answer (fallback), as opposed to a refused check.
TRANSPORT = frozenset(
    (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.ABORTED,
    )
)
_FALLBACK_CODE = {
    grpc.StatusCode.NOT_FOUND: "unknown_rule",
    grpc.StatusCode.UNAUTHENTICATED: "unauthenticated",
    grpc.StatusCode.PERMISSION_DENIED: "permission_denied",
}


class Settings:
    """Every setting of a client (see :class:`ringlimit.Client`)."""

    def __init__(
        self,
        seeds: Sequence[str],
        token: Optional[str] = None,
        *,
        leases: bool = False,
        deadline_ms: float = 5.0,
        cluster_id: str = "ringlimit",
        fail_open: bool = True,
        fallback_fraction: Optional[float] = None,
        fallback_max_keys: int = 100_000,
        discovery_timeout_ms: float = 500.0,
        refresh_interval_ms: float = 1_000.0,
        heartbeat_ms: int = 2_000,
        reserve_timeout_ms: float = 1_000.0,
        grpc_addrs: Optional[Mapping[str, str]] = None,
        max_cached_keys: int = 100_000,
        hot_keys_rate: float = PROMOTE_AT,
        tls_ca: Optional[CaSource] = None,
        tls_server_name: Optional[str] = None,
    ) -> None:
        if isinstance(seeds, str):
            seeds = [seeds]
        if not seeds:
            raise ValueError("no seeds: give at least one node's http://host:port (or grpc://host:port)")
        schemes = {s.strip().split("://", 1)[0].lower() for s in seeds if isinstance(s, str) and "://" in s}
        if "http" in schemes and "https" in schemes:
            raise ValueError(
                "seeds mix http:// and https://: a cluster's nodes serve TLS (--tls-cert) or none does"
            )
        #: TLS on every channel and discovery request: an https:// seed, or a tls_* setting.
        tls = "https" in schemes or tls_ca is not None or bool(tls_server_name)
        self.http_seeds: List[str] = []
        self.grpc_seeds: List[str] = []
        for s in seeds:
            g = grpc_target(s)
            if g is not None:
                self.grpc_seeds.append(g)
                continue
            h = http_base(s, tls)
            if h is None:
                if tls and s.strip().startswith("http://"):
                    raise ValueError(f"seed {s!r} is plaintext, but tls_ca/tls_server_name ask for TLS: give https://")
                raise ValueError(f"seed {s!r} is not an http://host:port, https://host:port or grpc://host:port address")
            self.http_seeds.append(h)
        self.tls: Optional[Tls] = Tls(tls_ca, tls_server_name) if tls else None
        if deadline_ms <= 0:
            raise ValueError("deadline_ms must be greater than 0")
        if fallback_fraction is not None and not 0 < fallback_fraction <= 1:
            raise ValueError(f"fallback_fraction {fallback_fraction} must be in (0, 1]")
        if not 1_000 <= heartbeat_ms <= 60_000:
            raise ValueError("heartbeat_ms must be between 1000 and 60000")
        self.token = token or None
        self.leases = leases
        if not hot_keys_rate > 0:
            raise ValueError("hot_keys_rate must be greater than 0")
        self.hot_keys_rate = hot_keys_rate
        self.deadline_s = deadline_ms / 1000.0
        self.cluster_id = cluster_id
        self.fail_open = fail_open
        self.fallback_fraction = fallback_fraction
        self.fallback_max_keys = fallback_max_keys
        self.discovery_timeout_s = discovery_timeout_ms / 1000.0
        self.refresh_interval_s = refresh_interval_ms / 1000.0
        self.heartbeat_ms = heartbeat_ms
        self.reserve_timeout_s = reserve_timeout_ms / 1000.0
        self.grpc_addrs: Dict[str, str] = dict(grpc_addrs or {})
        self.max_cached_keys = max_cached_keys
        self.metadata: Optional[Tuple[Tuple[str, str], ...]] = (
            (("authorization", f"Bearer {token}"),) if token else None
        )


class Stats:
    """What a client has done so far (counters read without a lock: approximate while
    checks run)."""

    __slots__ = (
        "direct",
        "degraded",
        "leased",
        "leased_denied",
        "lease_asks",
        "lease_grants",
        "lease_tokens",
        "given_back",
        "batches",
        "checks_sent",
        "streamed",
        "streams_opened",
        "refreshes",
        "refresh_failures",
    )

    def __init__(self) -> None:
        self.direct = 0
        self.degraded = 0
        self.leased = 0
        self.leased_denied = 0
        self.lease_asks = 0
        self.lease_grants = 0
        self.lease_tokens = 0
        self.given_back = 0
        self.batches = 0
        self.checks_sent = 0
        #: Of ``batches``, those answered on a CheckStream; and the streams opened.
        self.streamed = 0
        self.streams_opened = 0
        self.refreshes = 0
        self.refresh_failures = 0

    def snapshot(self, leased_fast: int = 0) -> Dict[str, int]:
        d = {f: getattr(self, f) for f in Stats.__slots__}
        d["leased"] += leased_fast
        return d


def answer_of(r: Any, leased: bool = False) -> Answer:
    """A ringlimit.v1 ``CheckResponse`` as an :class:`Answer`."""
    return Answer(
        r.allowed,
        r.limit,
        r.remaining,
        r.reset_at_ms,
        r.retry_after_ms,
        r.degraded,
        r.leased or leased,
        r.replica,
        r.blocked,
        r.shadow_denied if r.HasField("shadow_denied") else None,
    )


def shadowed(a: Answer, rule: Optional[Rule]) -> Answer:
    """A shadow rule's answer: always allowed, with what it would have decided."""
    if rule is None or not rule.shadow or a.shadow_denied is not None:
        return a
    return a.replace(shadow_denied=not a.allowed, allowed=True, retry_after_ms=0)


class Failure:
    """An owner that did not answer (the check falls back)."""

    __slots__ = ("why", "code")

    def __init__(self, why: str, code: Optional[grpc.StatusCode] = None) -> None:
        self.why = why
        self.code = code


Outcome = Union[Answer, RingLimitError, Failure]


def outcome_of_error(e: BaseException, single: bool) -> Outcome:
    """What an RPC error means for the checks it carried."""
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        code = e.code()
        refused = code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
        if code in TRANSPORT or not (single or refused):
            return Failure(f"owner unreachable ({code.name})", code)
        details = e.details() if hasattr(e, "details") else ""
        return from_status_message(details, _FALLBACK_CODE.get(code, "invalid_request"))
    return Failure(f"owner unreachable ({type(e).__name__})")


def outcomes_of_stream(resp: Any, n: int) -> List[Outcome]:
    """The outcomes of the ``n`` checks a ``CheckStreamResponse`` answers, in order."""
    if resp.HasField("error"):
        return [from_status_message(f"{resp.error.error}: {resp.error.message}", resp.error.error)] * n
    return outcomes_of_batch(resp)


def outcomes_of_batch(resp: Any) -> List[Outcome]:
    out: List[Outcome] = []
    for r in resp.results:
        if r.WhichOneof("result") == "answer":
            out.append(answer_of(r.answer))
        else:
            out.append(from_status_message(f"{r.error.error}: {r.error.message}", r.error.error))
    return out


class Core:
    """See the module's doc."""

    def __init__(self, settings: Settings, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.s = settings
        self.clock = clock
        self.topo = Topology.empty()
        self.stats = Stats()
        self.fallback = Fallback(settings.fallback_max_keys, settings.fallback_fraction)
        #: (rule spec -> key -> entry): the fast path's two lookups. Replaced whole when the
        #: rules change (never mutated in place by anyone but the checking threads).
        self.cache: Dict[Any, Dict[str, Entry]] = {}
        self.entries: Dict[int, Entry] = {}
        self.holder = str(uuid.uuid4())
        self.held = Held(clock)
        self.hot = HotKeys(self.s.hot_keys_rate)
        self.turn = 0
        self.leases_lock = threading.Lock()
        #: Taken on the fast path only where the GIL does not make ``next()`` atomic.
        self.fast_lock: Optional[threading.Lock] = None if GIL_GUARDS else threading.Lock()
        self.topo_lock = threading.Lock()
        self.channels: Dict[str, grpc.Channel] = {}
        #: One stub per channel: building one binds every method of the service, which cost a
        #: lone check more than the rest of the SDK's own work together.
        self.stubs: Dict[str, pb_grpc.RateLimiterStub] = {}
        self.down_until: Dict[str, int] = {}
        #: The synchronous client's check stream per owner channel, and the addresses that
        #: do not offer it (unary calls there).
        self.streams: Dict[str, CheckStream] = {}
        self.unary_only: Set[str] = set()
        self.closed = threading.Event()
        self.wake_refresh = threading.Event()
        self.wake_leases = threading.Event()
        self.ready = threading.Event()
        self.last_refresh_ask = 0
        self.watch_call: Optional[Any] = None
        self.watch_last = 0
        self.watching: Optional[str] = None
        self.watch_unsupported = False
        self.warned_auth = False
        self.threads: List[threading.Thread] = []
        self.on_links_changed: List[Callable[[Topology], None]] = []

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, discover_now: bool) -> None:
        """Discovers the cluster (now, bounded; or in the background) and starts the threads."""
        if discover_now:
            self.discover()
        self._thread("ringlimit-topology", self._watch_loop)
        self._thread("ringlimit-ticker", self._ticker_loop)
        if self.s.leases:
            self._thread("ringlimit-leases", self._lease_loop)

    def _thread(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def close(self) -> None:
        """Gives back what leases hold (bounded), stops the threads, closes the channels."""
        if self.closed.is_set():
            return
        if self.s.leases:
            with self.leases_lock:
                self.held.release_all()
                back = self.held.take_returns(self.clock())
            self._give_back_returns(back)
        self.closed.set()
        self.wake_refresh.set()
        self.wake_leases.set()
        call = self.watch_call
        if call is not None:
            call.cancel()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)
        with self.topo_lock:
            for st in self.streams.values():
                st.close()
            self.streams.clear()
            for ch in self.channels.values():
                ch.close()
            self.channels.clear()
            self.stubs.clear()

    # ---- topology --------------------------------------------------------------------------

    def channel(self, addr: str) -> grpc.Channel:
        ch = self.channels.get(addr)
        if ch is None:
            with self.topo_lock:
                ch = self.channels.get(addr)
                if ch is None:
                    ch = channel(addr, self.s.tls)
                    # Connect now, not at the first check (which has a few ms only).
                    grpc.channel_ready_future(ch)
                    self.channels[addr] = ch
        return ch

    def stub(self, addr: str) -> pb_grpc.RateLimiterStub:
        stub = self.stubs.get(addr)
        if stub is None:
            ch = self.channel(addr)
            with self.topo_lock:
                stub = self.stubs.get(addr)
                if stub is None or self.channels.get(addr) is not ch:
                    stub = pb_grpc.RateLimiterStub(ch)
                    self.stubs[addr] = stub
        return stub

    def stream(self, addr: str) -> Optional[CheckStream]:
        """The check stream to ``addr``, opened when there is none or the last one broke;
        ``None`` when ``addr`` does not offer one (or the client is closed)."""
        if addr in self.unary_only:
            return None
        st = self.streams.get(addr)
        if st is not None and not st.broken:
            return st
        if self.closed.is_set():
            return None
        stub = self.stub(addr)
        with self.topo_lock:
            st = self.streams.get(addr)
            if st is None or st.broken:
                if st is not None:
                    st.close()
                st = CheckStream(stub, self.s.metadata, f"ringlimit-stream-{addr}")
                self.streams[addr] = st
                self.stats.streams_opened += 1
        return st

    def stream_refused(self, addr: str, e: BaseException) -> None:
        """``addr`` refused the check stream: unary calls there from now on."""
        log.info("ringlimit: %s does not take CheckStream (%s): unary calls", addr, e.code().name if hasattr(e, "code") else e)
        self.unary_only.add(addr)

    def apply(self, new: Topology) -> bool:
        """Replaces the topology when ``new`` differs: a new version, caches dropped when the
        rules changed, leases released when the ring or the rules changed. Returns whether
        it changed."""
        self.stats.refreshes += 1
        with self.topo_lock:
            old = self.topo
            if old.rules is not None and old.same_as(new):
                self.ready.set()
                return False
            new.version = old.version + 1
            rules_changed = old.rules is None or not _same_rules(old, new)
            ring_changed = old.ring.members != new.ring.members
            self.topo = new
            if rules_changed:
                self.cache = {}
                self.entries = {}
            gone = set(self.channels) - set(new.grpc_addrs())
            for addr in gone:
                st = self.streams.pop(addr, None)
                if st is not None:
                    st.close()
                self.unary_only.discard(addr)
                self.stubs.pop(addr, None)
                self.channels.pop(addr).close()
                self.down_until.pop(addr, None)
            for addr in new.grpc_addrs():
                self.down_until.pop(addr, None)
        for addr in new.grpc_addrs():
            self.channel(addr)
        if (ring_changed or rules_changed) and self.s.leases:
            with self.leases_lock:
                self.held.release_all()
            self.wake_leases.set()
        for f in self.on_links_changed:
            f(new)
        self.ready.set()
        log.debug("ringlimit topology v%d: %s", new.version, sorted(new.members))
        return True

    def discover(self) -> bool:
        """Asks seeds and known members for the topology until one answers (each request
        bounded by the discovery timeout)."""
        topo = self.topo
        timeout = self.s.discovery_timeout_s
        # Nodes that answered UNIMPLEMENTED serve no Topology: straight to HTTP (grpc:// seeds
        # are still asked: they have no other way in).
        grpc_first = [] if self.watch_unsupported else ([self.watching] if self.watching else []) + topo.grpc_addrs()
        for addr in grpc_first + self.s.grpc_seeds:
            if self.closed.is_set():
                return False
            try:
                resp = self.stub(addr).Topology(
                    pb.TopologyRequest(), timeout=timeout, metadata=self.s.metadata
                )
                self.apply(from_response(resp, self.s.cluster_id, self.s.grpc_addrs, 0, self.s.tls is not None))
                return True
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self.watch_unsupported = True
            except DiscoveryError as e:
                log.debug("ringlimit discovery: %s", e)
        for base in topo.http_bases() + self.s.http_seeds:
            if self.closed.is_set():
                return False
            try:
                context = self.s.tls.context if self.s.tls is not None else None
                self.apply(fetch_http(base, self.s.cluster_id, timeout, self.s.grpc_addrs, 0, context))
                return True
            except DiscoveryError as e:
                log.debug("ringlimit discovery: %s", e)
        self.stats.refresh_failures += 1
        return False

    def ask_refresh(self) -> None:
        """A check failed: the topology may be stale (rate-limited)."""
        now = self.clock()
        if now - self.last_refresh_ask >= MIN_REFRESH_GAP_NS:
            self.last_refresh_ask = now
            self.wake_refresh.set()

    def _watch_loop(self) -> None:
        """Keeps the topology fresh: ``WatchTopology`` on one member (the last that answered
        first), another on failure after a bounded backoff; nodes without it are polled."""
        backoff = WATCH_BACKOFF_MIN_S
        if not self.ready.is_set():
            self.discover()
        while not self.closed.is_set():
            if self.watch_unsupported or not self.topo.grpc_addrs():
                # Nodes that stream no topology (or none reached yet): poll.
                self.wake_refresh.wait(self.s.refresh_interval_s)
                self.wake_refresh.clear()
                if not self.closed.is_set():
                    self.discover()
                continue
            candidates = ([self.watching] if self.watching else []) + [
                a for a in self.topo.grpc_addrs() + self.s.grpc_seeds if a != self.watching
            ]
            watched = False
            for addr in candidates:
                if self.closed.is_set():
                    return
                if self._watch(addr):
                    watched = True
                    backoff = WATCH_BACKOFF_MIN_S
                    break
            if not watched and not self.closed.is_set():
                # Every member failed: the seeds over HTTP, then wait a little longer each time.
                self.discover()
                self.closed.wait(backoff)
                backoff = min(backoff * 2, WATCH_BACKOFF_MAX_S)

    def _watch(self, addr: str) -> bool:
        """Watches ``addr`` until its stream ends; whether it sent anything."""
        got = False
        try:
            call = self.stub(addr).WatchTopology(
                pb.TopologyRequest(heartbeat_ms=self.s.heartbeat_ms), metadata=self.s.metadata
            )
            self.watch_call = call
            self.watch_last = self.clock()
            if self.closed.is_set():
                call.cancel()
            for resp in call:
                self.watch_last = self.clock()
                got = True
                self.watching = addr
                try:
                    self.apply(from_response(resp, self.s.cluster_id, self.s.grpc_addrs, 0, self.s.tls is not None))
                except DiscoveryError as e:
                    log.warning("ringlimit: %s", e)
                    call.cancel()
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.watch_unsupported = True
            elif not self.closed.is_set():
                log.debug("ringlimit: topology watch on %s ended: %s", addr, e.code())
        finally:
            self.watch_call = None
        if self.watching == addr and not got:
            self.watching = None
        return got

    def _ticker_loop(self) -> None:
        """Every tick: the watch's watchdog (a stream silent for three heartbeats is dead),
        the hot keys' tick."""
        tick_s = TICK_NS / 1e9
        while not self.closed.wait(tick_s):
            call = self.watch_call
            if call is not None and self.clock() - self.watch_last > 3 * self.s.heartbeat_ms * NANOS_PER_MS:
                call.cancel()
            if self.s.leases:
                with self.leases_lock:
                    promoted, demoted = self.hot.tick(list(self.held.entries.values()))
                    for e in promoted:
                        self.held.want(e)
                    for e in demoted:
                        self.held.release(e)
                if promoted or demoted:
                    self.wake_leases.set()

    # ---- checks ----------------------------------------------------------------------------

    def entry(
        self,
        spec: Any,
        key: str,
        rule: Optional[Union[str, Inline]],
        limit: Optional[int],
        period_ms: Optional[int],
    ) -> Union[Entry, Answer]:
        """The bucket of a check the cache does not hold yet (validated as a node would), or
        for a named rule while no node was ever reached, the fallback's answer."""
        validate_key(key)
        if limit is not None or period_ms is not None:
            if rule is not None:
                raise InvalidCheck("invalid_request", "give either `rule` or `limit` and `period_ms`, not both")
            if limit is None or period_ms is None:
                raise InvalidCheck("invalid_request", "an inline rule needs both `limit` and `period_ms`")
            resolved = resolve_inline(Inline(limit, period_ms))
        elif isinstance(rule, Inline):
            resolved = resolve_inline(rule)
        elif isinstance(rule, str):
            found = self.named(rule)
            if found is None:
                # No node reached yet: admitted without a limit (the rule is unknown here).
                return self.fall_back(None, None, 1)
            resolved = found
        else:
            raise InvalidCheck("invalid_request", "give `rule` (a name or an Inline) or `limit` and `period_ms`")
        id = _hash.bucket_id(resolved.seed, key)
        e = self.entries.get(id)
        if e is None or e.rule is not resolved and not e.rule.same(resolved):
            e = Entry(id, key, resolved)
            if len(self.entries) >= self.s.max_cached_keys:
                self._shrink()
            self.entries[id] = e
        keys = self.cache.get(spec)
        if keys is None:
            keys = self.cache[spec] = {}
        keys[key] = e
        return e

    def named(self, name: str) -> Optional[Rule]:
        """A named rule; ``None`` while no node was reached; :class:`UnknownRule` when the
        cluster has none of that name (after one refetch, rate-limited)."""
        rules = self.topo.rules
        if rules is None:
            self.ask_refresh()
            return None
        found = rules.get(name)
        if found is not None:
            return found
        now = self.clock()
        if now - getattr(self, "_unknown_at", 0) >= UNKNOWN_RULE_REFETCH_NS:
            self._unknown_at = now
            self.discover()
            rules = self.topo.rules or {}
            found = rules.get(name)
            if found is not None:
                return found
        raise UnknownRule("unknown_rule", f"no rule named {name!r}")

    def _shrink(self) -> None:
        """Too many buckets cached: keep the leased ones only."""
        keep = {id: e for id, e in self.entries.items() if e.leased}
        self.entries = keep
        self.cache = {}

    def check_cost(self, e: Entry, cost: int) -> None:
        cap = e.rule.limit if e.rule.global_mode else e.rule.capacity
        if not isinstance(cost, int) or cost < 0:
            raise InvalidCheck("invalid_cost", f"`cost` must be a whole number >= 0, got {cost!r}")
        if cost > cap:
            raise InvalidCheck(
                "invalid_cost", f"`cost` {cost} is over the rule's capacity {cap}: it could never pass"
            )

    def route(self, e: Entry) -> Optional[str]:
        """Where ``e``'s checks go now (cached per topology version); ``None`` without a
        member, or while that member's circuit is open."""
        topo = self.topo
        if e.version != topo.version:
            e.addr = topo.route(e.id)
            e.version = topo.version
        addr = e.addr
        if addr is None:
            return None
        until = self.down_until.get(addr)
        if until is not None and self.clock() < until:
            return None
        return addr

    def lease_path(self, e: Entry, cost: int) -> Optional[Answer]:
        """A check that the fast path did not decide: counted for hot keys, then decided on a
        slice, denied as the owner said, or ``None`` (to the owner)."""
        if not self.s.leases or not e.rule.leasable or e.rule.global_mode:
            return None
        self.turn += 1
        if self.turn % SAMPLE == 0:
            with self.leases_lock:
                self.hot.record(e)
        if not e.leased:
            return None
        with self.leases_lock:
            got = self.held.take(e, cost, self.clock())
            due = bool(self.held.due)
        if due:
            self.wake_leases.set()
        if got is None:
            return None
        allowed, remaining, retry = got
        if allowed:
            self.stats.leased += 1
            return Answer(True, e.limit, remaining, e.reset_at_ms, 0, False, True)
        self.stats.leased_denied += 1
        d = e.denied
        limit, reset_at_ms = (d.limit, d.reset_at_ms) if d is not None else (e.limit, e.reset_at_ms)
        return Answer(False, limit, 0, reset_at_ms, retry, False, True)

    def lease_low(self, e: Entry) -> None:
        """The fast path saw a slice run low."""
        with self.leases_lock:
            due = self.held.low(e)
        if due:
            self.wake_leases.set()

    def fall_back(self, e: Optional[Entry], why: Optional[Failure], cost: int) -> Answer:
        """The answer without the owner: the rule's share, denied for a fail-closed rule."""
        if why is not None:
            self.ask_refresh()
            if why.code == grpc.StatusCode.UNAVAILABLE and e is not None and e.addr:
                self.down_until[e.addr] = self.clock() + OPEN_FOR_NS
        if not self.s.fail_open:
            from .errors import Unavailable

            reason = why.why if why is not None else "no cluster member alive"
            raise Unavailable("unavailable", reason)
        self.stats.degraded += 1
        a, _ = self.fallback.decide(e.id if e else 0, e.rule if e else None, cost, self.topo.alive())
        return shadowed(a, e.rule if e else None)

    def fall_back_held(self, e: Entry, cost: int) -> Tuple[Answer, Optional[Taken]]:
        """:meth:`fall_back` with what it took (all-or-nothing gives it back on a denial)."""
        self.stats.degraded += 1
        return self.fallback.decide(e.id, e.rule, cost, self.topo.alive())

    def request(self, e: Entry, cost: int, hold: bool = False) -> Any:
        """The ringlimit.v1 ``CheckRequest`` of a check of ``e``."""
        req = pb.CheckRequest(key=e.key, cost=cost, hold=hold)
        e.rule.fill(req)
        return req

    def resolve(self, e: Entry, got: Outcome, cost: int) -> Answer:
        """A check's answer from what its owner said (or failed to)."""
        if isinstance(got, Answer):
            self.stats.direct += 1
            return got
        if isinstance(got, UnknownRule) and e.rule.name is not None:
            # The owner does not know a rule the client learnt (yet): look again, fall back.
            return self.fall_back(e, Failure("owner does not know the rule yet"), cost)
        if isinstance(got, RingLimitError):
            raise got
        return self.fall_back(e, got, cost)

    # ---- leases: the asking thread ---------------------------------------------------------

    def _lease_loop(self) -> None:
        while not self.closed.is_set():
            held = bool(self.held.entries)
            self.wake_leases.wait(SWEEP_S if held else TICK_NS / 1e9)
            self.wake_leases.clear()
            if self.closed.is_set():
                return
            try:
                self.lease_step()
            except Exception:  # the thread must outlive any one bad answer
                log.exception("ringlimit: lease round failed")

    def lease_step(self) -> None:
        """One round: the asks due, one Lease call per owner (all at once), then what is due
        back."""
        now = self.clock()
        with self.leases_lock:
            due = self.held.take_due(now)
        by_addr: Dict[str, List[Tuple[Entry, int, int, int]]] = {}
        for item in due:
            e = item[0]
            addr = self.topo.route(e.id)
            if addr is None:
                with self.leases_lock:
                    self.held.failed(e, now, 100 * NANOS_PER_MS)
                continue
            by_addr.setdefault(addr, []).append(item)
        futures = []
        for addr, items in by_addr.items():
            asks = []
            for e, want, demand, _ in items:
                ask = pb.LeaseAsk(key=e.key, want=want, demand_per_s=demand)
                e.rule.fill(ask)
                asks.append(ask)
            self.stats.lease_asks += len(asks)
            fut = self.stub(addr).Lease.future(
                pb.LeaseRequest(holder=self.holder, asks=asks),
                timeout=LEASE_WITHIN_S,
                metadata=self.s.metadata,
            )
            futures.append((fut, items))
        for fut, items in futures:
            try:
                resp = fut.result()
            except grpc.RpcError as err:
                code = err.code()
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    if not self.warned_auth:
                        self.warned_auth = True
                        log.warning("ringlimit: leases need a client credential (token=): %s", err.details())
                    backoff = 10 * BACKOFF_NS
                else:
                    log.debug("ringlimit: lease ask failed: %s", code)
                    backoff = 100 * NANOS_PER_MS
                later = self.clock()
                with self.leases_lock:
                    for item in items:
                        self.held.failed(item[0], later, backoff)
                continue
            later = self.clock()
            with self.leases_lock:
                for (e, _, _, asked), grant in zip(items, resp.grants):
                    kind = grant.WhichOneof("result")
                    if kind == "granted":
                        g = grant.granted
                        self.stats.lease_grants += 1
                        self.stats.lease_tokens += g.tokens
                        self.held.granted(
                            e, g.tokens, g.valid_ns, g.mark, g.answer.limit, g.answer.reset_at_ms, asked, later
                        )
                    elif kind == "refused":
                        self.held.refused(e, grant.refused, asked, later)
                    else:
                        if grant.error.error == "not_owner":
                            self.ask_refresh()
                        self.held.failed(e, later)
                for item in items[len(resp.grants) :]:
                    self.held.failed(item[0], later)
        with self.leases_lock:
            back = self.held.take_returns(self.clock())
        self._give_back_returns(back)

    def _give_back_returns(self, back: List[Tuple[Entry, int, Any]]) -> None:
        by_addr: Dict[str, List[Any]] = {}
        for e, tokens, mark in back:
            addr = self.topo.route(e.id)
            if addr is None:
                continue
            item = pb.GiveBackItem(key=e.key, tokens=tokens, mark=mark)
            e.rule.fill(item)
            by_addr.setdefault(addr, []).append(item)
        self.give_back(by_addr)

    def give_back(self, by_addr: Dict[str, List[Any]]) -> int:
        """GiveBack per owner, all at once (bounded); the tokens honoured."""
        futures = []
        for addr, items in by_addr.items():
            for i in range(0, len(items), MAX_BATCH):
                try:
                    futures.append(
                        self.stub(addr).GiveBack.future(
                            pb.GiveBackRequest(items=items[i : i + MAX_BATCH]),
                            timeout=LEASE_WITHIN_S,
                            metadata=self.s.metadata,
                        )
                    )
                except (ValueError, RuntimeError):  # a channel closed meanwhile
                    continue
        honoured = 0
        for fut in futures:
            try:
                honoured += sum(fut.result().honoured)
            except grpc.RpcError as e:
                log.debug("ringlimit: give-back failed (its tokens stay taken): %s", e.code())
        self.stats.given_back += honoured
        return honoured


def _same_rules(a: Topology, b: Topology) -> bool:
    if a.rules is None or b.rules is None:
        return a.rules is b.rules
    if a.rules.keys() != b.rules.keys():
        return False
    return all(r.same(b.rules[n]) for n, r in a.rules.items())


def as_check(item: Any) -> Tuple[str, Any, Optional[int], Optional[int], int]:
    """``(key, rule, limit, period_ms, cost)`` of a :class:`ringlimit.Check`, a mapping of the
    same fields, or a tuple ``(key, rule)``."""
    if isinstance(item, Mapping):
        return (
            item.get("key"),  # type: ignore[return-value]
            item.get("rule"),
            item.get("limit"),
            item.get("period_ms"),
            item.get("cost", 1),
        )
    if isinstance(item, tuple):
        fields = list(item) + [None] * (5 - len(item))
        key, rule, limit, period_ms, cost = fields[:5]
        return key, rule, limit, period_ms, 1 if cost is None else cost
    raise InvalidCheck("invalid_request", f"a check is a Check, a mapping or a tuple, not {type(item).__name__}")
