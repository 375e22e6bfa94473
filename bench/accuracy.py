#!/usr/bin/env python3
"""The accuracy contract's orchestrator and load client (see bench/accuracy.sh, which builds the
network namespaces and runs this in the client's one).

  accuracy.py --bin B --ns P --net 10.78.0 --out DIR --scenarios "kill split" [--no-check]

Each scenario starts a fresh 3-node cluster, spends every bucket's limit (one check of cost
LIMIT each), then sends checks at RATE/s while it does its fault, and counts what was admitted
on the buckets the scenario touches: admitted ÷ limit is 1.00 when the cluster was exact, and
every admission after the first fill is over the limit (nothing refills: a 365-day period, so
no token comes back and no fixed window ends within a run). Checks go only to nodes that are
live and reachable (a node is taken out of the client's list, its checks in flight answered,
before it is signalled; put back once it answers /readyz and sees the ring): any 5xx,
connection error or answer later than the deadline from one of them is a failed check.
"""

import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import Conn, paced, stop_processes  # noqa: E402  (shared with the fault bench)

# The contract: the most admitted ÷ limit each scenario may reach on the buckets it touches
# (a row per algorithm; both must keep it), and which buckets those are ("victim": n2's, as the
# ring placed them before the fault; "all": every bucket; "pairs": n2's, each checked in a
# /v1/check/all with a bucket of another owner). kill and split are the replicas' targets. The
# others were set on 2026-11-24 from two runs with failover to the replica (bench/README.md
# "Accuracy contract"; before it, kill, stop and all-or-nothing measured ~1.6), with a margin:
# what stays over is a cut-off node's own fallback share (a third of the limit at most: split,
# one way) and, after a SIGKILL, what the owner admitted in its last drain interval (~5 ms).
BOUNDS = {
    "kill": (1.05, "victim"),  # the replicas' target; measured 1.01-1.02
    "stop": (1.10, "victim"),  # measured 1.01-1.03
    # Traffic through the stopped node. n2 SIGSTOPped 3-5 s, batches of every bucket
    # queued in its socket, SIGCONT: before the pause detector, those batches were answered
    # from fresh fallback shares in about one pause in two (gossip had marked the peers dead).
    "through-stopped": (1.05, "all"),
    "split": (1.40, "all"),  # the replicas' target; measured 1.18-1.25 (n2's share: <= 1.33)
    "oneway-out": (1.35, "all"),  # measured 1.19-1.20
    "oneway-in": (1.35, "all"),  # measured 1.21-1.22
    # Exact by handover; a slow owner (a debug build on a busy host) that misses the forward
    # deadline has its keys decided by its replica, exact as well:
    "rolling": (1.10, "all"),  # measured 1.00
    "join-leave": (1.10, "all"),  # measured 1.00
    "all-or-nothing": (1.15, "pairs"),  # measured 1.01-1.08 (the owner SIGKILLed as in kill)
    # Clock skew: n2's wall clock 10 s ahead (libfaketime) from its start, killed and restarted as
    # in kill: owner-mode decisions, replicas, promotion and recall must not read wall clocks.
    "skew": (1.05, "victim"),
    # Not in CI (it needs an older build): a rolling upgrade, nodes started from OLD_BIN and
    # restarted one by one from BIN, as a Kubernetes rolling update does; mixed versions in
    # between (the newer peers speak the older protocol with them).
    "upgrade": (1.10, "all"),
    # Durable buckets (--data-dir, a node's own directory kept across its restarts): the whole
    # cluster stopped together and started again. SIGTERM flushes before exit: exact. SIGKILL
    # loses at most the last --persist-interval-ms of decisions. One node alone, SIGTERMed and
    # started again: exact. Without durable buckets each measures 2.00 (every bucket full again).
    "restart-all-term": (1.00, "all"),
    "restart-all-kill": (1.01, "all"),
    "restart-single": (1.00, "all"),
}

VICTIM = 2
# The skew scenario's clock: Debian's libfaketime moves n2's wall clock, not its monotonic one.
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SKEW = "+10s"
LIMIT = 20
PERIOD = "365d"
RULES = {"token_bucket": "acc-tb", "fixed_window": "acc-fw"}
# The other check of each /v1/check/all request: a limit it never reaches, so the request is
# decided by its measured bucket; what the partner was charged shows whether refunds held.
PARTNER, PARTNER_LIMIT = "acc-partner", 100_000
ADMIN_TOKEN = os.environ.get("RINGLIMIT_ADMIN_TOKEN") or f"accuracy-{os.getpid()}"
# How long each phase lasts, in seconds (the whole run stays within a few minutes).
SETTLE = 1.0  # load after the fill, before the fault (replicas catch up)
KILLED = 4.0  # a SIGKILLed owner stays down (the ring drops it after ~1.2 s)
STOPPED = 5.0  # SIGSTOP to SIGCONT
# through-stopped: the pauses (s), each with QUEUED batches of every bucket sent to n2 while it
# is stopped (one connection each, opened before), answered once it resumes.
PAUSES = (3.0, 4.0, 5.0, 3.5)
QUEUED = 6
PUMPS = 8  # connections sending single checks to n2 one after another, across each pause
QUEUED_DEADLINE = 15.0  # the pause, then the answer
PARTED = 7.0  # a partition lasts
AFTER = 3.0  # load once the cluster is whole again
WAIT = 30.0  # the longest wait for a node or a ring (each wait is bounded)


# Straight to the nodes, whatever *_proxy the environment names.
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def log(msg):
    print(f"[accuracy.py {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Cluster:
    """Up to four nodes, nI in namespace NS-nI at NET.1I (HTTP :8080, peer :7946)."""

    def __init__(self, args, name):
        self.args, self.name = args, name
        self.procs = {}
        self.gen = collections.Counter()  # bumped at each start: clients reconnect
        self.targets = set()  # nodes the load sends checks to
        self.inflight = collections.Counter()

    def addr(self, i):
        return f"{self.args.net}.1{i}"

    def start(self, i, seeds, binary=None):
        peers = ",".join(f"{self.addr(j)}:7946" for j in seeds)
        log_file = open(os.path.join(self.args.out, f"{self.name}-n{i}.log"), "ab")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"),
                   RINGLIMIT_ADMIN_TOKEN=ADMIN_TOKEN)
        if self.name == "skew" and i == VICTIM:
            if not os.path.exists(LIBFAKETIME):
                raise RuntimeError(f"the skew scenario needs {LIBFAKETIME} (apt-get install faketime)")
            env.update(LD_PRELOAD=LIBFAKETIME, FAKETIME=SKEW, FAKETIME_DONT_FAKE_MONOTONIC="1")
        durable = []
        if self.name.startswith("restart-"):
            durable = ["--data-dir", os.path.join(self.args.out, f"{self.name}-data-n{i}")]
        # `ip netns exec` execs the node: the pid is the node's (signals reach it).
        self.procs[i] = subprocess.Popen(
            ["ip", "netns", "exec", f"{self.args.ns}-n{i}", binary or self.args.bin, "serve",
             "--node-id", f"n{i}", "--http", f"{self.addr(i)}:8080",
             "--peer", f"{self.addr(i)}:7946", "--seeds", peers, "--config", self.args.rules,
             *durable, *self.args.node_args.split()],
            stdout=subprocess.DEVNULL, stderr=log_file, env=env,
        )
        log_file.close()
        self.gen[i] += 1

    def get(self, i, path, timeout=1.0, admin=False):
        req = urllib.request.Request(f"http://{self.addr(i)}:8080{path}")
        if admin:
            req.add_header("authorization", f"Bearer {ADMIN_TOKEN}")
        try:
            with NO_PROXY.open(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return None, b""

    def whole(self, nodes, members):
        """Whether each of `nodes` is ready and sees `members` alive in a quorate ring."""
        for i in nodes:
            status, _ = self.get(i, "/readyz")
            if status != 200:
                return False
            status, body = self.get(i, "/v1/cluster")
            if status != 200:
                return False
            v = json.loads(body)
            alive = sorted(m["node_id"] for m in v["members"] if m["state"] == "alive")
            if v["ring_members"] != len(members) or not v.get("quorate", True) \
                    or alive != sorted(f"n{j}" for j in members):
                return False
        return True

    async def wait_whole(self, nodes, members, what):
        # Polled in a thread: the event loop also runs the load and times its answers.
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            for i in nodes:
                if self.procs[i].poll() is not None:
                    raise RuntimeError(f"n{i} exited ({self.procs[i].returncode}) before {what}")
            if await asyncio.to_thread(self.whole, nodes, members):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{what}: not within {WAIT:.0f} s")

    async def drain(self, i):
        """Takes node i out of the load's list and waits (bounded) for its checks in flight."""
        self.targets.discard(i)
        deadline = time.monotonic() + self.args.deadline + 1
        while self.inflight[i] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def exited(self, i, within=15.0):
        deadline = time.monotonic() + within
        while self.procs[i].poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"n{i} did not exit within {within:.0f} s of SIGTERM")
            await asyncio.sleep(0.05)

    async def iptables(self, i, *rule):
        # Not subprocess.run: a blocking call would add its time to every answer in flight.
        p = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", f"{self.args.ns}-n{i}", "iptables", *rule)
        if await p.wait() != 0:
            raise RuntimeError(f"iptables {' '.join(rule)} in n{i} failed")

    def stop_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except OSError:
                    pass
        stop_processes(list(self.procs.values()))


class Load:
    """RATE checks/s, each to the next node of the cluster's list, of an item drawn at random:
    an item is a tuple of buckets (rule, key), one for /v1/check, two for /v1/check/all."""

    def __init__(self, cluster, items, args):
        self.cluster, self.items, self.args = cluster, items, args
        self.admitted = collections.Counter()  # bucket -> cost admitted
        self.checks = 0
        self.failed = []  # (t, node, reason)
        self.degraded = 0
        self.stop = False
        self.turn = 0

    def body(self, item, cost):
        checks = [{"key": k, "rule": r, "cost": cost} for r, k in item]
        if len(item) == 1:
            return "/v1/check", json.dumps(checks[0]).encode()
        return "/v1/check/all", json.dumps({"checks": checks}).encode()

    async def one(self, conns, n, item, cost=1):
        c = self.cluster
        conn = conns.get(n)
        if conn is None or conn.gen != c.gen[n]:
            if conn is not None:
                conn.close()
            conn = conns[n] = Conn(c.addr(n), 8080)
            conn.gen = c.gen[n]
        path, body = self.body(item, cost)
        c.inflight[n] += 1
        self.checks += 1
        try:
            status, data = await asyncio.wait_for(
                conn.request("POST", path, body), self.args.deadline)
            if status not in (200, 429):
                raise ValueError(f"status {status}: {data[:120]!r}")
            a = json.loads(data)
            if a["allowed"]:
                for b in item:
                    self.admitted[b] += cost
            self.degraded += bool(a["degraded"])
        except Exception as e:  # noqa: BLE001  (every way a check can fail is a failed check)
            conn.close()
            reason = "timeout" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__} {e}"
            self.failed.append((time.time(), f"n{n}", reason))
        finally:
            c.inflight[n] -= 1

    def next_node(self):
        targets = sorted(self.cluster.targets)
        if not targets:
            return None
        self.turn += 1
        return targets[self.turn % len(targets)]

    async def fill(self, buckets):
        """Spends each bucket's limit: one check of cost LIMIT each, 8 at a time."""
        todo = [(b,) for b in buckets]

        async def filler():
            conns = {}
            while todo:
                item = todo.pop()
                await self.one(conns, self.next_node(), item, cost=LIMIT)
            for conn in conns.values():
                conn.close()

        await asyncio.gather(*(filler() for _ in range(8)))

    async def worker(self, w):
        conns = {}
        rng = random.Random(w)
        async for _ in paced(self.args.workers / self.args.rate, rng, lambda: not self.stop):
            n = self.next_node()
            if n is not None:
                await self.one(conns, n, rng.choice(self.items))
        for conn in conns.values():
            conn.close()

    async def run(self):
        await asyncio.gather(*(self.worker(w) for w in range(self.args.workers)))


async def owners(cluster, buckets):
    """Each bucket's owner in n0's ring (the admin API's key view: a cost-0 check, nothing taken)."""
    def lookup():
        out = {}
        for rule, key in buckets:
            status, body = cluster.get(0, f"/v1/admin/keys/{key}?rule={rule}", timeout=5, admin=True)
            if status != 200:
                raise RuntimeError(f"admin key view of {rule}/{key}: {status} {body[:120]!r}")
            out[(rule, key)] = json.loads(body)["owner"]
        return out
    return await asyncio.to_thread(lookup)


async def partner_gap(cluster, load):
    """What the partners were charged beyond the requests admitted (their owners' view, read
    through the admin API once the load has stopped): 0 when every denied request's refund
    arrived; a lost refund charges its partner 1 (a false deny at worst, never an admission)."""
    partners = sorted({b for item in load.items for b in item if b[0] == PARTNER})

    def charged():
        total = 0
        for rule, key in partners:
            status, body = cluster.get(0, f"/v1/admin/keys/{key}?rule={rule}", timeout=5, admin=True)
            if status != 200:
                raise RuntimeError(f"admin key view of {rule}/{key}: {status} {body[:120]!r}")
            total += PARTNER_LIMIT - json.loads(body)["state"]["remaining"]
        return total
    return await asyncio.to_thread(charged) - sum(load.admitted[b] for b in partners)


async def split_fault(cluster, name, on):
    v = VICTIM
    if not on:
        await cluster.iptables(v, "-F", "INPUT")
        await cluster.iptables(v, "-F", "OUTPUT")
        return
    for j in range(3):
        if j == v:
            continue
        peer = cluster.addr(j)
        if name in ("split", "oneway-in"):
            await cluster.iptables(v, "-A", "INPUT", "-s", peer, "-j", "DROP")
        if name in ("split", "oneway-out"):
            await cluster.iptables(v, "-A", "OUTPUT", "-d", peer, "-j", "DROP")


async def through_stopped(cluster, load, buckets, sleep):
    """Stops n2 (SIGSTOP) for each of PAUSES while QUEUED batches of every bucket wait in its
    socket, resumes it (SIGCONT) and counts what those batches admitted: every bucket is spent,
    so each admission is over the limit. The load goes on through n0 and n1 meanwhile."""
    checks = [{"key": k, "rule": r} for r, k in buckets]
    body = json.dumps({"checks": checks}).encode()
    rng = random.Random(43)

    async def pump(conn, running):
        """Single checks to n2 one after another, across the pause: some are in flight (at n2
        or at their owners) when it stops, and time out there when it resumes."""
        try:
            while running():
                b = rng.choice(buckets)
                status, data = await asyncio.wait_for(
                    conn.request("POST", "/v1/check", json.dumps({"key": b[1], "rule": b[0]}).encode()),
                    QUEUED_DEADLINE)
                if status not in (200, 429):
                    raise ValueError(f"status {status}: {data[:120]!r}")
                a = json.loads(data)
                load.checks += 1
                if a["allowed"]:
                    load.admitted[b] += 1
                load.degraded += bool(a["degraded"])
        except Exception as e:  # noqa: BLE001
            reason = "timeout" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__} {e}"
            load.failed.append((time.time(), f"n{VICTIM}", f"pumped check: {reason}"))
        finally:
            conn.close()

    for pause in PAUSES:
        # Keep-alive connections n2 has accepted before it stops, as a proxy's would be.
        conns = [Conn(cluster.addr(VICTIM), 8080) for _ in range(QUEUED)]
        for conn in conns:
            status, _ = await asyncio.wait_for(conn.request("GET", "/healthz"), load.args.deadline)
            if status != 200:
                raise RuntimeError(f"n2 /healthz: {status}")
        pumping = True
        pumps = [asyncio.get_running_loop().create_task(
            pump(Conn(cluster.addr(VICTIM), 8080), lambda: pumping)) for _ in range(PUMPS)]
        await cluster.drain(VICTIM)
        os.kill(cluster.procs[VICTIM].pid, signal.SIGSTOP)
        await sleep(pause - 0.5)

        async def queued(conn):
            try:
                status, data = await asyncio.wait_for(
                    conn.request("POST", "/v1/check/batch", body), QUEUED_DEADLINE)
                if status != 200:
                    raise ValueError(f"status {status}: {data[:120]!r}")
                answers = json.loads(data)["results"]
                if len(answers) != len(buckets):
                    raise ValueError(f"{len(answers)} answers to {len(buckets)} checks")
                for b, a in zip(buckets, answers):
                    load.checks += 1
                    if a.get("allowed"):
                        load.admitted[b] += 1
                    load.degraded += bool(a.get("degraded"))
            except Exception as e:  # noqa: BLE001  (a batch that fails is a failed check)
                reason = "timeout" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__} {e}"
                load.failed.append((time.time(), f"n{VICTIM}", f"queued batch: {reason}"))
            finally:
                conn.close()

        batches = [asyncio.get_running_loop().create_task(queued(c)) for c in conns]
        await sleep(0.5)
        os.kill(cluster.procs[VICTIM].pid, signal.SIGCONT)
        await asyncio.gather(*batches)
        await sleep(1.0)
        pumping = False
        await asyncio.gather(*pumps)
        await cluster.wait_whole(range(3), range(3), "the resumed node back in every ring")
        cluster.targets.add(VICTIM)
        await sleep(1.0)


async def kill_and_restart(cluster, sleep):
    await cluster.drain(VICTIM)
    cluster.procs[VICTIM].kill()
    cluster.procs[VICTIM].wait()
    await sleep(KILLED)
    cluster.start(VICTIM, range(3))
    await cluster.wait_whole(range(3), range(3), "the restarted owner back in every ring")
    cluster.targets.add(VICTIM)


async def run_scenario(name, args):
    """Returns (rows, error): rows for the table, error a string when the run could not finish."""
    cluster = Cluster(args, name)
    stamp = int(time.time() * 1000)
    load = None
    runner = None
    refund_gap = None
    started = time.monotonic()
    try:
        first = None
        if name == "upgrade":
            first = os.environ.get("OLD_BIN")
            if not first:
                raise RuntimeError("the upgrade scenario starts from OLD_BIN: set it to an older build")
        # Durable buckets' scenarios start from empty directories.
        for i in range(3):
            shutil.rmtree(os.path.join(args.out, f"{name}-data-n{i}"), ignore_errors=True)
        nodes = [0] if name == "restart-single" else [0, 1, 2]
        for i in nodes:
            cluster.start(i, nodes, first)
        await cluster.wait_whole(nodes, nodes, "the cluster forming")
        cluster.targets = set(nodes)
        buckets = [(rule, f"{name}-{stamp}-{algo[0]}{k}") for algo, rule in RULES.items()
                   for k in range(args.keys)]
        owner = await owners(cluster, buckets)
        which = BOUNDS[name][1]
        mine = [b for b in buckets if owner[b] == f"n{VICTIM}"]
        if which == "victim":
            items = [(b,) for b in mine]
        elif which == "pairs":
            # Each victim bucket with a partner bucket another node owns: the two checks of a
            # request live on different owners.
            partners = [(PARTNER, f"{name}-{stamp}-p{k}") for k in range(2 * args.keys)]
            partner_owner = await owners(cluster, partners)
            partners = [b for b in partners if partner_owner[b] != f"n{VICTIM}"]
            items = list(zip(mine, partners))
        else:
            items = [(b,) for b in buckets]
        load = Load(cluster, items, args)
        await load.fill([b for item in items for b in item if b[0] != PARTNER])
        runner = asyncio.get_running_loop().create_task(load.run())

        async def sleep(s):
            await asyncio.sleep(s)
            if runner.done():
                runner.result()  # a load that died says why

        await sleep(SETTLE)
        if name in ("kill", "all-or-nothing", "skew"):
            await kill_and_restart(cluster, sleep)
        elif name == "stop":
            await cluster.drain(VICTIM)
            os.kill(cluster.procs[VICTIM].pid, signal.SIGSTOP)
            await sleep(STOPPED)
            os.kill(cluster.procs[VICTIM].pid, signal.SIGCONT)
            await cluster.wait_whole(range(3), range(3), "the resumed owner back in every ring")
            cluster.targets.add(VICTIM)
        elif name == "through-stopped":
            await through_stopped(cluster, load, buckets, sleep)
        elif name in ("split", "oneway-out", "oneway-in"):
            await split_fault(cluster, name, True)
            await sleep(PARTED)
            await split_fault(cluster, name, False)
            await cluster.wait_whole(range(3), range(3), "every ring whole after the heal")
        elif name in ("rolling", "upgrade"):
            for i in range(3):
                await cluster.drain(i)
                cluster.procs[i].terminate()
                await cluster.exited(i)
                cluster.start(i, range(3))
                await cluster.wait_whole(range(3), range(3), f"n{i} back after its restart")
                cluster.targets.add(i)
                await sleep(1.0)
        elif name in ("restart-all-term", "restart-all-kill", "restart-single"):
            for i in nodes:
                await cluster.drain(i)
            if name == "restart-all-kill":
                # At once: what was decided in the last interval before the kill may be lost.
                for i in nodes:
                    cluster.procs[i].kill()
                for i in nodes:
                    cluster.procs[i].wait()
            else:
                for i in nodes:
                    cluster.procs[i].terminate()
                for i in nodes:
                    await cluster.exited(i)
            for i in nodes:
                cluster.start(i, nodes)
            await cluster.wait_whole(nodes, nodes, "every node back after the restart")
            cluster.targets = set(nodes)
        elif name == "join-leave":
            cluster.start(3, range(3))
            await cluster.wait_whole(range(4), range(4), "n3 joined")
            cluster.targets.add(3)
            await sleep(2.0)
            await cluster.drain(1)
            cluster.procs[1].terminate()
            await cluster.exited(1)
            await cluster.wait_whole([0, 2, 3], [0, 2, 3], "n1 gone from every ring")
        else:
            raise RuntimeError(f"unknown scenario {name}")
        await sleep(AFTER)
        load.stop = True
        await asyncio.wait_for(runner, args.deadline + 5)
        if which == "pairs":
            refund_gap = await partner_gap(cluster, load)
        error = None
    except Exception as e:  # noqa: BLE001  (reported in the table: the run fails)
        error = f"{type(e).__name__}: {e}"
    finally:
        if load is not None:
            load.stop = True
        if runner is not None:
            try:
                await asyncio.wait_for(runner, args.deadline + 5)
            except Exception as e:  # noqa: BLE001
                error = error or f"load: {type(e).__name__}: {e}"
        cluster.stop_all()
    if load is None:
        return [], error or "no load ran", 0.0
    rows = []
    for algo, rule in RULES.items():
        bs = sorted({b for item in load.items for b in item if b[0] == rule})
        admitted = sum(load.admitted[b] for b in bs)
        rows.append({
            "scenario": name, "algorithm": algo, "keys": len(bs), "which": BOUNDS[name][1],
            "limit": LIMIT * len(bs), "admitted": admitted,
            "ratio": admitted / (LIMIT * len(bs)) if bs else 0.0, "bound": BOUNDS[name][0],
        })
    stats = {"checks": load.checks, "failed": len(load.failed), "degraded": load.degraded,
             "failures": load.failed[:20], "refund_gap": refund_gap}
    for r in rows:
        r.update(stats)
    return rows, error, time.monotonic() - started


def table(rows):
    out = ["| scenario | keys | limit | admitted | admitted ÷ limit | bound | checks | failed | ok |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        keys = {"victim": f"n{VICTIM}'s {r['keys']}", "all": f"all {r['keys']}",
                "pairs": f"n{VICTIM}'s {r['keys']}, paired"}[r["which"]]
        ok = "yes" if r["ok"] and not r["pending"] else "**no**"
        if r["ok"] and r["pending"]:
            ok = "over, pending"
        elif r.get("error"):
            ok += f": {r['error']}"
        out.append(
            f"| {r['scenario']} ({r['algorithm']}) | {keys} | {r['keys']} × {LIMIT} "
            f"| {r['admitted']} | {r['ratio']:.2f} | {r['bound']:.2f} | {r['checks']} "
            f"| {r['failed']} | {ok} |")
    return "\n".join(out)


async def orchestrate(args):
    rows = []
    for name in args.scenarios.split():
        if name not in BOUNDS:
            log(f"unknown scenario {name} (known: {' '.join(BOUNDS)})")
            return 2
        log(f"{name}: starting")
        got, error, took = await run_scenario(name, args)
        if error:
            log(f"{name}: {error}")
        if not got:
            got = [{"scenario": name, "algorithm": "-", "keys": 0, "which": "all", "limit": 0,
                    "admitted": 0, "ratio": 0.0, "bound": BOUNDS[name][0], "checks": 0,
                    "failed": 0}]
        for r in got:
            r["error"] = error
            r["within"] = r["ratio"] <= r["bound"]
            r["pending"] = name in args.pending and not r["within"]
            r["ok"] = error is None and r["failed"] == 0 and (r["within"] or r["pending"])
            r["seconds"] = took
        log(f"{name}: {took:.1f} s, " + ", ".join(
            f"{r['algorithm']} {r['ratio']:.2f}" for r in got)
            + f", {got[0]['checks']} checks, {got[0]['failed']} failed"
            + (f", partners charged {got[0]['refund_gap']} beyond the admitted requests"
               if got[0].get("refund_gap") is not None else ""))
        for t, n, reason in (got[0].get("failures") or [])[:5]:
            log(f"{name}: failed check at {t:.3f} through {n}: {reason}")
        rows.extend(got)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(table(rows))
    bad = [r for r in rows if not r["ok"]]
    if bad:
        log("FAILED: " + ", ".join(sorted({r["scenario"] for r in bad})))
        return 1 if args.check else 0
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--ns", required=True)
    ap.add_argument("--net", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenarios", required=True)
    ap.add_argument("--no-check", dest="check", action="store_false",
                    help="exit 0 even when a scenario is over its bound or a check failed")
    ap.add_argument("--keys", type=int, default=int(os.environ.get("KEYS", 75)),
                    help="keys per algorithm")
    ap.add_argument("--rate", type=float, default=float(os.environ.get("RATE", 800)))
    ap.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", 20)))
    ap.add_argument("--deadline", type=float,
                    default=float(os.environ.get("DEADLINE_MS", 2000)) / 1000)
    ap.add_argument("--pending", default=os.environ.get("PENDING", ""),
                    help="scenarios whose bound is a target the code does not meet yet: "
                    "reported, but over it they do not fail the run (failed checks still do)")
    ap.add_argument("--node-args", default=os.environ.get("NODE_ARGS", ""),
                    help="more `ringlimit serve` flags for every node, e.g. --replicas 0")
    args = ap.parse_args()
    args.pending = set(args.pending.split())
    args.rules = os.path.join(args.out, "rules.yaml")
    with open(args.rules, "w") as f:
        f.write("rules:\n" + "".join(
            f"  - {{ name: {rule}, limit: {LIMIT}, period: {PERIOD}, algorithm: {algo} }}\n"
            for algo, rule in RULES.items())
            + f"  - {{ name: {PARTNER}, limit: {PARTNER_LIMIT}, period: {PERIOD} }}\n")
    try:
        return asyncio.run(orchestrate(args))
    except KeyboardInterrupt:  # the nodes were stopped on the way out (run_scenario's finally)
        return 130


if __name__ == "__main__":
    sys.exit(main())
