"""Simulated Envoys against an RLQS server (`envoy.service.rate_limit_quota.v3`): each one does
what Envoy's rate_limit_quota filter does with its global client (source/extensions/filters/
http/rate_limit_quota/global_client_impl.cc), over a bidirectional stream of its own. grpcio's
asyncio API carries Envoy's own generated types (PyPI `envoy-data-plane`); `.ci/run` makes the
environment (/tmp/ringlimit-grpc-venv).

    python tests/python/rlqs_envoys.py ADDR[,ADDR...] [--envoys 10] [--demand 200] [--skew 0.8]
        [--bucket '{"name":"api","tenant":"acme"}' ...] [--duration 15] [--limit-rate 100]
        [--change-at S] [--no-assignment allow_all|deny_all] [--expired reuse|allow_all|deny_all]
        [--arrivals even|poisson] [--seed 1] [--report-interval 1] [--envoy-quirks]
        [--new-bucket full|carry] [--refill continuous|interval] [--backoff 0.2] [--warmup 2]

What each simulated Envoy does:
- Envoy i opens its stream to address i mod len(ADDRS) (a channel of its own: its own
  connection). A stream that ends or breaks is reopened on the next address after --backoff
  (200 ms); buckets and their assignments are kept (until their TTL), reports that fall due
  while no stream is open are dropped with their counts, as Envoy drops them.
- Requests for each --bucket arrive at the Envoy's demand rate (requests/s; --arrivals even:
  evenly spaced from a seeded phase, poisson: seeded exponential gaps). --demand is the total
  over the Envoys: Envoy 0 has --skew of it (0.8), the others share the rest equally (--skew 0:
  all equal). --change-at S: at S s Envoy 0 and Envoy 1 swap demands.
- A bucket's first request creates it and is decided by --no-assignment (Envoy's default:
  allow all); a report of that bucket alone goes at once. From the first bucket on, every
  --report-interval a report of every bucket goes: counts since its last report, time_elapsed
  since its last report (or its creation).
- Assignments: a token bucket becomes a local one (full at max_tokens, or with --new-bucket
  carry as full as the one it replaces, as newer Envoys do; refilled continuously at
  tokens_per_fill per fill_interval as Envoy's AtomicTokenBucketImpl does, or once a fill
  interval with --refill interval); one equal to the active one keeps its tokens (Envoy keeps
  the limiter). requests_per_time_unit: a fixed window a unit long. Blanket rules: allow or deny
  all. When assignment_time_to_live passes without another, --expired decides (reuse: the last
  assignment goes on; allow_all / deny_all); a TTL of exactly 0 ends the assignment at once
  (back to --no-assignment); no TTL never expires. abandon_action forgets the bucket: its next
  request creates it again (and reports at once).
- --envoy-quirks: what Envoy's client does besides the protocol's words: time_elapsed and TTLs
  in whole seconds (no TTL: expired at once), a token bucket's rate as tokens_per_fill over the
  whole seconds of fill_interval (under a second: no limit at all), an equal token bucket found
  by max_tokens, tokens_per_fill and fill_interval's nanos, a new one starting as full as the
  old one was (--new-bucket carry), requests_per_time_unit and an unset strategy ignored.
  Without it such answers are obeyed as the protocol says and only noted in `warnings`.

Prints JSON lines on stdout:
- {"event": "start", "wall": unix time of t=0, "envoys", "addrs", "demands"}.
- One line per second of the run: {"t": s, "admitted", "denied", "demand" (arrivals that second),
  "rate_sum" (the token-bucket rates assigned at its end, first bucket), "per_envoy": [{"admitted",
  "denied", "demand", "rate_assigned", "state"}]} ("state": what decides the first bucket).
- Events: {"event": "assignment", "envoy", "t", "bucket", "strategy", "ttl_s", "rate", "kept"
  (the tokens kept: the same token bucket), "ended" (TTL 0)}, "abandon", "expired",
  "reconnect" ({"from", "to", "code", "details"}: the stream ended; the next one opens on "to"
  after --backoff), "protocol_error", "stream_failed".
- Last: {"event": "summary", ...}: totals; with --limit-rate R, admitted / (R x duration)
  ("admitted_ratio"; "steady_ratio" without the first --warmup s) and the largest second
  ("max_second_ratio"); each Envoy's max-min fair share of R, and for each Envoy while its
  demand is under its fair share ("quiet") admitted / demand over those seconds ("quiet_ratio")
  and its worst second ("quiet_min_second"); with --change-at, the time from the change to the
  first assignment that moves Envoy 1 at least half way to its new fair share
  ("change_latency_s"; "change_latency_down_s" for Envoy 0); counts of assignments, abandons,
  reconnects and expiries; per bucket what decided its requests ("decided_by"); warnings.

Exits 0; 2 after a protocol error (an answer that does not parse, a bucket action without a
bucket id or an action, a strategy the protocol forbids); 3 when a stream ends with a status no
server should answer (UNIMPLEMENTED, INVALID_ARGUMENT, ...: the run stops there); 1 on a bug.
The run is bounded by --duration (and a hard stop 20 s after it).
"""
import argparse
import asyncio
import datetime
import json
import math
import random
import signal
import sys
import time

import betterproto2
import grpc
import grpc.aio
from envoy_data_plane.envoy.service.rate_limit_quota.v3 import (
    BucketId,
    RateLimitQuotaResponse,
    RateLimitQuotaUsageReports,
    RateLimitQuotaUsageReportsBucketQuotaUsage,
)
from envoy_data_plane.envoy.type.v3 import RateLimitStrategyBlanketRule, RateLimitUnit

METHOD = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
# A stream that ends with one of these is reopened (the server went away, restarted, or ended
# the stream); any other status is a server bug and stops the run.
TRANSIENT = {
    grpc.StatusCode.OK,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
UNIT_S = {
    RateLimitUnit.SECOND: 1,
    RateLimitUnit.MINUTE: 60,
    RateLimitUnit.HOUR: 3600,
    RateLimitUnit.DAY: 86400,
    RateLimitUnit.MONTH: 30 * 86400,
    RateLimitUnit.YEAR: 365 * 86400,
}


def ident(b):
    return b


# The messages inside a RateLimitQuotaResponse, by field number: what check_wire walks.
DURATION = {}
TOKEN_BUCKET = {2: {}, 3: DURATION}
STRATEGY = {2: {}, 3: TOKEN_BUCKET}
RESPONSE = {1: {1: {1: {}}, 2: {2: DURATION, 3: STRATEGY}, 3: {}}}


def varint(b, i):
    shift = value = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ValueError(f"a truncated varint at byte {i}")
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return value, i


def check_wire(b, schema):
    """Raises unless `b` is well-formed protobuf down the messages `schema` names (the parser
    here skips what it cannot read)."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError(f"field number 0 at byte {i}")
        if wire == 0:
            _, i = varint(b, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = varint(b, i)
            if i + n <= len(b) and schema.get(field) is not None:
                check_wire(b[i:i + n], schema[field])
            i += n
        else:
            raise ValueError(f"wire type {wire} at byte {i}")
        if i > len(b):
            raise ValueError("a field runs past the end of its message")


def seconds(d):
    """A protobuf Duration (a timedelta here) in seconds."""
    return d.total_seconds()


def bucket_key(bucket):
    return tuple(sorted(bucket.items()))


def key_name(key):
    return ",".join(f"{k}={v}" for k, v in key)


def fair_shares(rate, demands):
    """Max-min fair shares of `rate` for `demands`: the smallest demands in full, the rest
    equal."""
    share = [0.0] * len(demands)
    order = sorted(range(len(demands)), key=lambda i: demands[i])
    left = rate
    for k, i in enumerate(order):
        equal = left / (len(order) - k)
        if demands[i] <= equal:
            share[i] = demands[i]
            left -= demands[i]
        else:
            for j in order[k:]:
                share[j] = equal
            break
    return share


def rnd(x, digits=3):
    if x is None or isinstance(x, float) and (math.isinf(x) or math.isnan(x)):
        return None
    return round(x, digits)


class Out:
    """JSON lines on stdout, and what the summary needs of them."""

    def __init__(self, t0):
        self.t0 = t0

    def now(self):
        return time.monotonic() - self.t0

    def line(self, obj):
        sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    def event(self, kind, envoy, t, **fields):
        self.line({"event": kind, "envoy": envoy, "t": rnd(t), **fields})


class TokenBucket:
    def __init__(self, max_tokens, per_fill, interval_s, t, a, initial=None):
        self.max = float(max_tokens)
        self.per_fill = per_fill
        self.interval = interval_s
        self.tokens = self.max if initial is None else min(self.max, initial)
        self.last = t
        self.start = t
        self.fills = 0
        self.interval_mode = a.refill == "interval"
        if a.envoy_quirks:
            whole = math.floor(interval_s)
            self.rate = per_fill / whole if whole > 0 else math.inf
        else:
            self.rate = per_fill / interval_s

    def refill(self, t):
        """The tokens at `t`."""
        if self.interval_mode and not math.isinf(self.rate):
            fills = math.floor((t - self.start) / self.interval)
            if fills > self.fills:
                self.tokens = min(self.max, self.tokens + (fills - self.fills) * self.per_fill)
                self.fills = fills
        elif t > self.last:
            if math.isinf(self.rate):
                self.tokens = self.max
            else:
                self.tokens = min(self.max, self.tokens + (t - self.last) * self.rate)
            self.last = t
        return self.tokens

    def allow(self, t):
        if math.isinf(self.rate):
            return True  # filled faster than anything takes
        self.refill(t)
        if self.max > 0 and self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class Window:
    """requests_per_time_unit: a fixed window of `unit_s`."""

    def __init__(self, n, unit_s):
        self.n, self.unit = n, unit_s
        self.rate = n / unit_s
        self.window, self.count = None, 0

    def allow(self, t):
        w = math.floor(t / self.unit)
        if w != self.window:
            self.window, self.count = w, 0
        if self.count < self.n:
            self.count += 1
            return True
        return False


class Assignment:
    def __init__(self, kind, same_as, limiter, rate, expires_at, strategy_json):
        self.kind = kind  # token_bucket, requests_per_time_unit, allow_all, deny_all
        self.same_as = same_as  # what an equal assignment compares equal by
        self.limiter = limiter
        self.rate = rate  # requests/s; inf for allow_all
        self.expires_at = expires_at  # None: never
        self.strategy = strategy_json

    def allow(self, t):
        if self.kind == "allow_all":
            return True
        if self.kind == "deny_all":
            return False
        return self.limiter.allow(t)


class Bucket:
    def __init__(self, bid, t):
        self.id = bid
        self.created = t
        self.last_report = t
        self.allowed = 0
        self.denied = 0
        self.assignment = None
        self.expired = False  # the TTL passed and --expired reuse keeps the assignment
        self.fallback = None  # after the TTL with --expired allow_all / deny_all


class Totals:
    def __init__(self):
        self.admitted = 0
        self.denied = 0
        self.decided_by = {}
        self.assignments = 0
        self.abandons = 0
        self.strategies = []

    def count(self, how, allowed):
        ad = self.decided_by.setdefault(how, [0, 0])
        ad[0 if allowed else 1] += 1
        if allowed:
            self.admitted += 1
        else:
            self.denied += 1


class Envoy:
    def __init__(self, i, sim):
        self.i = i
        self.sim = sim
        self.a = sim.a
        self.out = sim.out
        self.addr_i = i % len(sim.addrs)
        self.rng = random.Random(sim.a.seed * 1_000_003 + i)
        self.buckets = {}
        # Per --bucket: the next arrival time.
        self.next_arrival = [self.first_arrival() for _ in sim.bucket_ids]
        self.next_report = None
        self.connected = False
        self.outbox = asyncio.Queue()
        n = sim.seconds
        self.adm = [0] * n
        self.den = [0] * n
        self.arr = [0] * n
        self.rate_at = [None] * n
        self.state_at = [None] * n
        self.assignments = 0
        self.abandons = 0
        self.reconnects = 0
        self.expiries = 0
        self.dropped_reports = 0
        self.unknown_bucket_actions = 0
        # (t, rate) of each assignment of the first bucket.
        self.history = []

    # ---- demand
    def demand(self, t):
        return self.sim.demand_of(self.i, t)

    def first_arrival(self):
        d = self.demand(0.0)
        if d <= 0:
            return math.inf
        if self.a.arrivals == "poisson":
            return self.rng.expovariate(d)
        return self.rng.random() / d

    def gap(self, t):
        d = self.demand(t)
        if d <= 0:
            return math.inf
        if self.a.arrivals == "poisson":
            return self.rng.expovariate(d)
        return 1.0 / d

    def following(self, t):
        """The arrival after one at `t`; across --change-at the rest of the gap is rescaled to
        the new demand."""
        nxt = t + self.gap(t)
        c = self.a.change_at
        if c is not None and t < c <= nxt:
            old, new = self.demand(t), self.demand(c)
            if new <= 0:
                return math.inf
            nxt = c + (nxt - c) * old / new
        return nxt

    # ---- deciding
    def advance(self, now):
        """Decides every request that arrived before `now`, in order of arrival."""
        for b, bid in enumerate(self.sim.bucket_ids):
            while self.next_arrival[b] < now and self.next_arrival[b] < self.a.duration:
                t = self.next_arrival[b]
                self.request(bid, t)
                self.next_arrival[b] = self.following(t)
        for bucket in self.buckets.values():
            self.check_expiry(bucket, now)

    def check_expiry(self, bucket, t):
        a = bucket.assignment
        if a is None or bucket.expired or a.expires_at is None or t < a.expires_at:
            return
        self.expiries += 1
        self.out.event("expired", self.i, a.expires_at, bucket=bucket.id,
                       behavior=self.a.expired)
        if self.a.expired == "reuse":
            bucket.expired = True
        else:
            bucket.assignment = None
            bucket.fallback = self.a.expired

    def request(self, bid, t):
        key = bucket_key(bid)
        bucket = self.buckets.get(key)
        created = bucket is None
        if created:
            bucket = Bucket(bid, t)
            self.buckets[key] = bucket
            if self.next_report is None:
                self.next_report = t + self.a.report_interval
        self.check_expiry(bucket, t)
        a = bucket.assignment
        if a is not None:
            allowed = a.allow(t)
            how = ("expired_" if bucket.expired else "") + a.kind
        elif bucket.fallback is not None:
            allowed = bucket.fallback == "allow_all"
            how = "expired_" + bucket.fallback
        else:
            allowed = self.a.no_assignment == "allow_all"
            how = "no_assignment"
        if allowed:
            bucket.allowed += 1
        else:
            bucket.denied += 1
        s = int(t)
        if s < len(self.adm):
            self.arr[s] += 1
            if allowed:
                self.adm[s] += 1
            else:
                self.den[s] += 1
        self.sim.totals[key].count(how, allowed)
        if created:
            # Envoy reports a new bucket at once, its first request counted.
            self.send(self.usage([bucket], max(self.sim.out.now(), t)))

    # ---- reporting
    def usage(self, buckets, now):
        usages = []
        for b in buckets:
            elapsed = max(now - b.last_report, 0.001)
            if self.a.envoy_quirks:
                elapsed = float(math.floor(elapsed))
            usages.append(RateLimitQuotaUsageReportsBucketQuotaUsage(
                bucket_id=BucketId(bucket=dict(b.id)),
                time_elapsed=datetime.timedelta(seconds=elapsed),
                num_requests_allowed=b.allowed,
                num_requests_denied=b.denied,
            ))
            b.allowed = b.denied = 0
            b.last_report = now
        return bytes(RateLimitQuotaUsageReports(domain=self.a.domain, bucket_quota_usages=usages))

    def periodic(self, now):
        if self.next_report is None or now < self.next_report:
            return
        self.send(self.usage(list(self.buckets.values()), now))
        self.next_report += self.a.report_interval
        if self.next_report <= now:
            self.next_report = now + self.a.report_interval

    def send(self, msg):
        if self.connected:
            self.outbox.put_nowait(msg)
        else:
            self.dropped_reports += 1

    # ---- answers
    def on_response(self, raw, now):
        self.advance(now)
        try:
            check_wire(raw, RESPONSE)
            resp = RateLimitQuotaResponse().parse(raw)
        except Exception as e:  # noqa: BLE001 - any failure to parse is the server's
            self.sim.protocol_error(self.i, now, f"response does not parse: {e!r}")
            return
        for action in resp.bucket_action:
            if action.bucket_id is None or not action.bucket_id.bucket:
                self.sim.protocol_error(self.i, now, "a bucket action without a bucket id")
                continue
            key = bucket_key(action.bucket_id.bucket)
            which, value = betterproto2.which_one_of(action, "bucket_action")
            bucket = self.buckets.get(key)
            if which not in ("quota_assignment_action", "abandon_action"):
                self.sim.protocol_error(self.i, now, f"a bucket action with no action: {key}")
                continue
            if bucket is None:
                # Envoy drops it (a bucket it does not hold: abandoned a moment ago, say).
                self.unknown_bucket_actions += 1
                continue
            if which == "abandon_action":
                del self.buckets[key]
                self.abandons += 1
                self.sim.totals[key].abandons += 1
                self.out.event("abandon", self.i, now, bucket=bucket.id)
                continue
            self.assign(bucket, value, now)

    def assign(self, bucket, qa, now):
        a, sim = self.a, self.sim
        ttl = qa.assignment_time_to_live
        ttl_s = None if ttl is None else seconds(ttl)
        if ttl_s is not None and ttl_s < 0:
            sim.protocol_error(self.i, now, f"a negative assignment_time_to_live: {ttl_s}")
            return
        if ttl_s is None:
            sim.warn("an assignment without assignment_time_to_live: Envoy's client expires it "
                     "at once (it reads the TTL's seconds)")
        elif ttl_s != math.floor(ttl_s):
            sim.warn("an assignment_time_to_live in fractions of a second: Envoy's client uses "
                     "its whole seconds")
        if a.envoy_quirks:
            ttl_s = float(math.floor(ttl_s)) if ttl_s is not None else 0.0
        strategy = qa.rate_limit_strategy
        which, value = ("", None) if strategy is None else betterproto2.which_one_of(strategy,
                                                                                      "strategy")
        kept = False
        old = bucket.assignment
        if which == "":
            sim.warn("an assignment without rate_limit_strategy: Envoy's client ignores it (the "
                     "protocol says allow all)")
            if a.envoy_quirks:
                return
            assignment = Assignment("allow_all", ("allow_all",), None, math.inf, None,
                                    {"unset": True})
        elif which == "blanket_rule":
            if value == RateLimitStrategyBlanketRule.DENY_ALL:
                assignment = Assignment("deny_all", ("deny_all",), None, 0.0, None,
                                        {"blanket_rule": "DENY_ALL"})
            else:
                assignment = Assignment("allow_all", ("allow_all",), None, math.inf, None,
                                        {"blanket_rule": "ALLOW_ALL"})
        elif which == "token_bucket":
            tb = value
            per_fill = 1 if tb.tokens_per_fill is None else tb.tokens_per_fill
            interval = None if tb.fill_interval is None else seconds(tb.fill_interval)
            if tb.max_tokens <= 0 or per_fill <= 0 or interval is None or interval <= 0:
                sim.protocol_error(
                    self.i, now,
                    f"a token bucket the protocol forbids (max_tokens, tokens_per_fill > 0, "
                    f"fill_interval required > 0): {tb.to_dict()}")
                return
            if interval != math.floor(interval):
                sim.warn("a token bucket's fill_interval in fractions of a second: Envoy's client "
                         "fills tokens_per_fill over its whole seconds (under 1 s: no limit)")
            if a.envoy_quirks:
                same_as = ("token_bucket", tb.max_tokens, per_fill,
                           tb.fill_interval.microseconds * 1000)
            else:
                same_as = ("token_bucket", tb.max_tokens, per_fill, interval)
            strategy_json = {"token_bucket": {"max_tokens": tb.max_tokens,
                                              "tokens_per_fill": per_fill,
                                              "fill_interval_s": interval}}
            if old is not None and old.kind == "token_bucket" and old.same_as == same_as and (
                    a.envoy_quirks or not bucket.expired):
                limiter, kept = old.limiter, True
            else:
                initial = None
                if a.new_bucket == "carry" and old is not None and old.kind == "token_bucket":
                    # Newer Envoys start the new bucket as full as the old one was.
                    level = old.limiter.refill(now)
                    initial = tb.max_tokens * (level / old.limiter.max if old.limiter.max else 0)
                limiter = TokenBucket(tb.max_tokens, per_fill, interval, now, a, initial)
            assignment = Assignment("token_bucket", same_as, limiter, limiter.rate, None,
                                    strategy_json)
        elif which == "requests_per_time_unit":
            sim.warn("requests_per_time_unit: Envoy's client does not support it (ignored)")
            if a.envoy_quirks:
                return
            unit_s = UNIT_S.get(value.time_unit)
            if unit_s is None:
                sim.protocol_error(self.i, now, f"requests_per_time_unit without a unit: "
                                                f"{value.to_dict()}")
                return
            n = value.requests_per_time_unit
            same_as = ("requests_per_time_unit", n, unit_s)
            if old is not None and old.same_as == same_as and not bucket.expired:
                limiter, kept = old.limiter, True
            else:
                limiter = Window(n, unit_s)
            assignment = Assignment("requests_per_time_unit", same_as, limiter, limiter.rate,
                                    None, {"requests_per_time_unit": {
                                        "requests_per_time_unit": n, "unit_s": unit_s}})
        else:
            sim.protocol_error(self.i, now, f"an unknown rate limit strategy: {which}")
            return
        self.assignments += 1
        key = bucket_key(bucket.id)
        totals = sim.totals[key]
        totals.assignments += 1
        name = assignment.kind
        if name not in totals.strategies:
            totals.strategies.append(name)
        ended = ttl_s == 0
        self.out.event("assignment", self.i, now, bucket=bucket.id,
                       strategy=assignment.strategy, ttl_s=ttl_s, rate=rnd(assignment.rate),
                       kept=kept, ended=ended)
        if key == sim.first_key:
            self.history.append((now, 0.0 if ended else assignment.rate))
        bucket.expired = False
        bucket.fallback = None
        if ended:
            # TTL 0: the assignment ends at once, back to --no-assignment.
            bucket.assignment = None
            return
        assignment.expires_at = None if ttl_s is None else now + ttl_s
        bucket.assignment = assignment

    def first_bucket_state(self):
        bucket = self.buckets.get(self.sim.first_key)
        if bucket is None:
            return None, "none"
        a = bucket.assignment
        if a is not None:
            rate = a.rate if a.kind in ("token_bucket", "requests_per_time_unit") else None
            if a.kind == "deny_all":
                rate = 0.0
            return rate, ("expired_" if bucket.expired else "") + a.kind
        if bucket.fallback is not None:
            return None, "expired_" + bucket.fallback
        return None, "no_assignment"

    # ---- the stream
    async def run(self):
        a, sim = self.a, self.sim
        addrs = sim.addrs
        while not sim.stopping:
            addr = addrs[self.addr_i]
            channel = grpc.aio.insecure_channel(
                addr, options=[("grpc.use_local_subchannel_pool", 1)])
            call = channel.stream_stream(METHOD, request_serializer=ident,
                                         response_deserializer=ident)()
            self.outbox = asyncio.Queue()
            self.connected = True
            writer = asyncio.create_task(self.write(call))
            code, details = grpc.StatusCode.OK, ""
            try:
                while True:
                    msg = await call.read()
                    if msg is grpc.aio.EOF:
                        break
                    self.on_response(msg, self.out.now())
                code = await call.code()
                details = await call.details()
            except grpc.aio.AioRpcError as e:
                code, details = e.code(), e.details()
            except asyncio.CancelledError:
                self.connected = False
                writer.cancel()
                await channel.close(grace=None)
                raise
            self.connected = False
            writer.cancel()
            await channel.close(grace=None)
            if sim.stopping:
                return
            # gRPC core reports a connection reset mid-stream (the server SIGKILLed) as
            # INTERNAL "Internal error from Core": a broken connection, not an answer.
            broken = code == grpc.StatusCode.INTERNAL and "from Core" in (details or "")
            if code not in TRANSIENT and not broken:
                sim.fatal(self.i, self.out.now(), addr, code, details)
                return
            self.reconnects += 1
            self.addr_i = (self.addr_i + 1) % len(addrs)
            self.out.event("reconnect", self.i, self.out.now(), **{
                "from": addr, "to": addrs[self.addr_i], "code": code.name,
                "details": (details or "")[:200]})
            await asyncio.sleep(a.backoff)

    async def write(self, call):
        try:
            while True:
                msg = await self.outbox.get()
                await call.write(msg)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a broken stream: the reader sees why
            self.connected = False


class Sim:
    def __init__(self, a):
        self.a = a
        self.addrs = a.addrs.split(",")
        self.seconds = int(math.ceil(a.duration))
        self.bucket_ids = [json.loads(b) for b in (a.bucket or ['{"name":"api","tenant":"acme"}'])]
        for b in self.bucket_ids:
            if not isinstance(b, dict) or not b or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in b.items()):
                raise SystemExit(f"--bucket must be a JSON object of strings: {b!r}")
        self.first_key = bucket_key(self.bucket_ids[0])
        self.totals = {bucket_key(b): Totals() for b in self.bucket_ids}
        n = a.envoys
        if n > 1 and a.skew > 0:
            self.demands = [a.demand * a.skew] + [a.demand * (1 - a.skew) / (n - 1)] * (n - 1)
        else:
            self.demands = [a.demand / n] * n
        self.changed = list(self.demands)
        if a.change_at is not None and n >= 2:
            self.changed[0], self.changed[1] = self.demands[1], self.demands[0]
        self.stopping = False
        self.errors = []
        self.fatal_status = None
        self.warnings = {}
        self.out = None
        self.envoys = []
        self.ran = 0.0

    def demand_of(self, i, t):
        if self.a.change_at is not None and t >= self.a.change_at:
            return self.changed[i]
        return self.demands[i]

    def protocol_error(self, envoy, t, what):
        self.errors.append({"envoy": envoy, "t": rnd(t), "error": what})
        self.out.event("protocol_error", envoy, t, error=what)

    def warn(self, what):
        self.warnings[what] = self.warnings.get(what, 0) + 1

    def fatal(self, envoy, t, addr, code, details):
        self.fatal_status = {"envoy": envoy, "t": rnd(t), "addr": addr, "code": code.name,
                             "details": details}
        self.out.event("stream_failed", envoy, t, addr=addr, code=code.name, details=details)
        self.stopping = True

    async def run(self):
        a = self.a
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        t0 = time.monotonic()
        wall = time.time()
        self.out = Out(t0)
        self.envoys = [Envoy(i, self) for i in range(a.envoys)]
        self.out.line({"event": "start", "wall": wall, "envoys": a.envoys, "addrs": self.addrs,
                       "demands": [rnd(d) for d in self.demands],
                       "buckets": self.bucket_ids})
        tasks = [asyncio.create_task(e.run()) for e in self.envoys]
        emitted = 0
        while True:
            now = min(self.out.now(), a.duration)
            for e in self.envoys:
                e.advance(now)
                e.periodic(now)
            while emitted < self.seconds and now >= min(emitted + 1, a.duration):
                self.second(emitted)
                emitted += 1
            if now >= a.duration or self.stopping:
                break
            await asyncio.sleep(a.tick)
        self.ran = now
        self.stopping = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return emitted

    def stop(self):
        self.stopping = True

    def second(self, s):
        per = []
        rate_sum = 0.0
        for e in self.envoys:
            rate, state = e.first_bucket_state()
            e.rate_at[s], e.state_at[s] = rate, state
            if rate is not None and state == "token_bucket":
                rate_sum += rate
            per.append({"admitted": e.adm[s], "denied": e.den[s], "demand": e.arr[s],
                        "rate_assigned": rnd(rate), "state": state})
        self.out.line({
            "t": s,
            "admitted": sum(p["admitted"] for p in per),
            "denied": sum(p["denied"] for p in per),
            "demand": sum(p["demand"] for p in per),
            "rate_sum": rnd(rate_sum),
            "per_envoy": per,
        })

    def summary(self, seconds_run):
        a = self.a
        es = self.envoys
        duration = self.ran  # --duration, unless stopped early
        admitted = sum(sum(e.adm) for e in es)
        denied = sum(sum(e.den) for e in es)
        s = {
            "event": "summary",
            "duration": rnd(duration),
            "envoys": a.envoys,
            "addrs": self.addrs,
            "demands": [rnd(d) for d in self.demands],
            "admitted": admitted,
            "denied": denied,
            "arrivals": admitted + denied,
            "assignments": sum(e.assignments for e in es),
            "abandons": sum(e.abandons for e in es),
            "reconnects": sum(e.reconnects for e in es),
            "expiries": sum(e.expiries for e in es),
            "dropped_reports": sum(e.dropped_reports for e in es),
            "unknown_bucket_actions": sum(e.unknown_bucket_actions for e in es),
            "buckets": {key_name(k): {"admitted": t.admitted, "denied": t.denied,
                                      "decided_by": t.decided_by, "assignments": t.assignments,
                                      "abandons": t.abandons, "strategies": t.strategies}
                        for k, t in self.totals.items()},
            "protocol_errors": self.errors,
            "stream_failed": self.fatal_status,
            "warnings": self.warnings,
        }
        per = [{"admitted": sum(e.adm), "denied": sum(e.den), "arrivals": sum(e.arr),
                "assignments": e.assignments, "abandons": e.abandons,
                "reconnects": e.reconnects, "expiries": e.expiries,
                "last_rate": rnd(e.history[-1][1]) if e.history else None} for e in es]
        R = a.limit_rate
        if R:
            secs = [sum(e.adm[i] for e in es) for i in range(seconds_run)]
            warm = min(int(a.warmup), len(secs))
            steady = secs[warm:]
            s["limit_rate"] = R
            s["admitted_ratio"] = rnd(admitted / (R * duration), 4)
            s["steady_ratio"] = rnd(sum(steady) / (R * len(steady)), 4) if steady else None
            s["max_second_ratio"] = rnd(max(secs) / R, 4) if secs else None
            before = fair_shares(R, self.demands)
            after = fair_shares(R, self.changed)
            quiet_ratios, quiet_seconds = [], []
            for i, e in enumerate(es):
                per[i]["fair_share"] = rnd(before[i])
                if a.change_at is not None:
                    per[i]["fair_share_after_change"] = rnd(after[i])
                adm = arr = 0
                worst = None
                for sec in range(warm, seconds_run):
                    change_sec = a.change_at is not None and sec <= a.change_at < sec + 1
                    d = self.demand_of(i, sec)
                    fair = after[i] if a.change_at is not None and sec >= a.change_at else \
                        before[i]
                    if change_sec or d <= 0 or d > fair * (1 + 1e-9) or e.arr[sec] == 0:
                        continue
                    adm += e.adm[sec]
                    arr += e.arr[sec]
                    r = e.adm[sec] / e.arr[sec]
                    worst = r if worst is None else min(worst, r)
                if arr:
                    per[i]["quiet_ratio"] = rnd(adm / arr, 4)
                    per[i]["quiet_min_second"] = rnd(worst, 4)
                    quiet_ratios.append(adm / arr)
                    quiet_seconds.append(worst)
            s["quiet_worst_ratio"] = rnd(min(quiet_ratios), 4) if quiet_ratios else None
            s["quiet_worst_second"] = rnd(min(quiet_seconds), 4) if quiet_seconds else None
            if a.change_at is not None and len(es) >= 2:
                s["change_at"] = a.change_at
                for i, name in ((1, "change_latency_s"), (0, "change_latency_down_s")):
                    e = es[i]
                    held = [r for t, r in e.history if t < a.change_at]
                    old = held[-1] if held else before[i]
                    if math.isinf(old):
                        old = before[i]
                    target = after[i]
                    mid = old + 0.5 * (target - old)
                    up = target >= old
                    hit = next((t for t, r in e.history if t >= a.change_at and (
                        r >= mid if up else r <= mid)), None)
                    s[name] = rnd(hit - a.change_at) if hit is not None else None
                    s[name.replace("latency", "threshold").replace("_s", "")] = rnd(mid)
        s["max_rate_sum"] = rnd(max((sum(e.rate_at[i] or 0 for e in es
                                          if e.state_at[i] == "token_bucket")
                                      for i in range(seconds_run)), default=0.0))
        s["per_envoy"] = per
        return s


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("addrs", help="the RLQS servers, host:port[,host:port...]")
    ap.add_argument("--envoys", type=int, default=10)
    ap.add_argument("--domain", default="edge")
    ap.add_argument("--bucket", action="append",
                    help='a bucket id as JSON (repeatable; default {"name":"api","tenant":"acme"})')
    ap.add_argument("--demand", type=float, default=200.0,
                    help="requests/s of each bucket over all the Envoys")
    ap.add_argument("--skew", type=float, default=0.8,
                    help="Envoy 0's share of --demand (0: all equal)")
    ap.add_argument("--arrivals", choices=("even", "poisson"), default="even")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--report-interval", type=float, default=1.0)
    ap.add_argument("--no-assignment", choices=("allow_all", "deny_all"), default="allow_all")
    ap.add_argument("--expired", choices=("reuse", "allow_all", "deny_all"), default="reuse")
    ap.add_argument("--refill", choices=("continuous", "interval"), default="continuous")
    ap.add_argument("--envoy-quirks", action="store_true")
    ap.add_argument("--new-bucket", choices=("full", "carry"),
                    help="a changed token bucket starts full, or as full as the old one was "
                         "(newer Envoys; the default with --envoy-quirks)")
    ap.add_argument("--backoff", type=float, default=0.2)
    ap.add_argument("--limit-rate", type=float, help="the rule's rate (requests/s), for ratios")
    ap.add_argument("--change-at", type=float, help="Envoys 0 and 1 swap demands at S s")
    ap.add_argument("--warmup", type=float, default=2.0,
                    help="seconds left out of the steady and quiet figures")
    ap.add_argument("--tick", type=float, default=0.005)
    a = ap.parse_args(argv)
    if a.new_bucket is None:
        a.new_bucket = "carry" if a.envoy_quirks else "full"
    if a.envoys < 1 or a.duration <= 0 or a.report_interval <= 0 or not 0 <= a.skew < 1:
        ap.error("--envoys >= 1, --duration > 0, --report-interval > 0, 0 <= --skew < 1")
    return a


def main():
    a = parse_args(sys.argv[1:])
    sim = Sim(a)

    async def bounded():
        return await asyncio.wait_for(sim.run(), a.duration + 20)

    seconds_run = asyncio.run(bounded())
    sim.out.line(sim.summary(seconds_run))
    if sim.fatal_status is not None:
        sys.exit(3)
    if sim.errors:
        sys.exit(2)


if __name__ == "__main__":
    main()
