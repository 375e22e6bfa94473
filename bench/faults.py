#!/usr/bin/env python3
"""The fault bench's orchestrator and load client (see bench/faults.sh, which builds the network
namespaces and runs this in the client's one).

  faults.py --bin B --ns P --out DIR --scenarios "split stall" [--check]
  faults.py poll URL            # run inside a node's namespace: prints its /v1/cluster each 100 ms
"""

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

NODES = ["n0", "n1", "n2"]
VICTIM = 2
PEERS_OF_VICTIM = ["10.77.0.10", "10.77.0.11"]
KEYS = 300
LIMIT = 10
PERIOD_MS = 3_600_000
TRY_TIMEOUT = 0.25


def addr(i):
    return f"10.77.0.1{i}"


def http_addr(i):
    return f"{addr(i)}:8080"


class Conn:
    """One keep-alive HTTP/1.1 connection (raw: no client library measured in the latency)."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def request(self, method, path, body=b""):
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("closed")
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        data = await self.reader.readexactly(length)
        return status, data

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def paced(interval, rng, running):
    """Yields once every `interval` s (from a random phase) while `running()`; a turn that came
    late (a try timed out) does not make the next ones burst to catch up."""
    nxt = time.monotonic() + rng.random() * interval
    while running():
        delay = nxt - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        nxt = max(nxt + interval, time.monotonic())
        yield


class Load:
    def __init__(self, prefix, rate, workers=20):
        self.prefix, self.rate, self.workers = prefix, rate, workers
        self.samples = []  # (t, total_s, node, try_s, allowed, degraded, failed, key)
        self.stop = False

    async def one(self, conns, first, key):
        body = json.dumps(
            {"key": key, "limit": LIMIT, "period_ms": PERIOD_MS, "algorithm": "token_bucket"}
        ).encode()
        start = time.monotonic()
        for k in range(len(NODES)):
            n = (first + k) % len(NODES)
            t0 = time.monotonic()
            try:
                status, data = await asyncio.wait_for(
                    conns[n].request("POST", "/v1/check", body), TRY_TIMEOUT
                )
                if status not in (200, 429):
                    raise ValueError(f"status {status}")
                a = json.loads(data)
                end = time.monotonic()
                return (start, end - start, n, end - t0, a["allowed"], a["degraded"], False, key)
            except Exception:
                conns[n].close()
        return (start, time.monotonic() - start, -1, 0.0, False, False, True, key)

    async def worker(self, w):
        conns = [Conn(addr(i), 8080) for i in range(len(NODES))]
        rng = random.Random(w)
        k = w
        async for _ in paced(self.workers / self.rate, rng, lambda: not self.stop):
            key = f"{self.prefix}:{rng.randrange(KEYS)}"
            self.samples.append(await self.one(conns, k % len(NODES), key))
            k += 1
        for c in conns:
            c.close()

    async def run(self):
        await asyncio.gather(*(self.worker(w) for w in range(self.workers)))


class Cluster:
    def __init__(self, args):
        self.args = args
        self.procs = [None] * len(NODES)
        self.pollers = []
        self.polls = []  # (t, node, view or None)

    def ns(self, i):
        return f"{self.args.ns}-{NODES[i]}"

    def start_node(self, i):
        seeds = ",".join(f"{addr(j)}:7946" for j in range(len(NODES)))
        log = open(os.path.join(self.args.out, f"node-{NODES[i]}.log"), "ab")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
        self.procs[i] = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(i), self.args.bin, "serve",
             "--node-id", NODES[i], "--http", http_addr(i), "--peer", f"{addr(i)}:7946",
             "--seeds", seeds],
            stdout=subprocess.DEVNULL, stderr=log, env=env,
        )

    async def iptables(self, i, *rule):
        # Not subprocess.run: this event loop also runs the load and times its answers, and a
        # blocking `ip netns exec iptables` (10-25 ms each) added its time to every answer in
        # flight (the 50-61 ms "slowest answers" at the instant of a heal were these).
        p = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", self.ns(i), "iptables", *rule)
        if await p.wait() != 0:
            raise RuntimeError(f"iptables {' '.join(rule)} in {self.ns(i)} failed")

    async def start_pollers(self):
        for i in range(len(NODES)):
            p = await asyncio.create_subprocess_exec(
                "ip", "netns", "exec", self.ns(i), sys.executable, os.path.abspath(__file__),
                "poll", http_addr(i), stdout=asyncio.subprocess.PIPE,
            )
            self.pollers.append(p)
            asyncio.get_running_loop().create_task(self.read_polls(i, p))

    async def read_polls(self, i, p):
        while True:
            line = await p.stdout.readline()
            if not line:
                return
            t, _, view = line.decode().partition(" ")
            try:
                v = json.loads(view)
            except ValueError:
                v = None
            self.polls.append((float(t), i, v))

    def latest(self, before):
        """Each node's last poll at or before `before` (monotonic-comparable wall time)."""
        last = {}
        for t, i, v in self.polls:
            if t <= before:
                last[i] = (t, v)
        return last

    def agreed(self, at):
        last = self.latest(at)
        if len(last) < len(NODES):
            return False
        for t, v in last.values():
            if v is None or at - t > 0.5:
                return False
            if v["ring_members"] != len(NODES) or not v.get("quorate", True):
                return False
        return True

    def owners_disagree(self, at):
        """Whether two nodes that each own keys (quorate) see different rings at `at`."""
        rings = set()
        for t, v in self.latest(at).values():
            if v is None or at - t > 0.5 or not v.get("quorate", True):
                continue
            alive = tuple(sorted(m["node_id"] for m in v["members"] if m["state"] == "alive"))
            rings.add(alive)
        return len(rings) > 1

    async def wait_formed(self, within=30.0):
        deadline = time.time() + within
        while time.time() < deadline:
            if self.agreed(time.time()):
                return True
            await asyncio.sleep(0.1)
        return False

    def stop_all(self):
        for p in self.procs:
            if p and p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except OSError:
                    pass
        for p in self.pollers:
            if p.returncode is None:
                p.terminate()
        stop_processes(self.procs)


def stop_processes(procs):
    """SIGTERM to every node still running, then a bounded wait for each (SIGKILL after 10 s)."""
    for p in procs:
        if p and p.poll() is None:
            p.terminate()
    for p in procs:
        if p:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


async def fault(cluster, name, on):
    """Applies (on) or removes scenario `name`'s fault on the victim."""
    v = VICTIM
    if name == "stall":
        os.kill(cluster.procs[v].pid, signal.SIGSTOP if on else signal.SIGCONT)
        return
    if not on:
        await cluster.iptables(v, "-F", "INPUT")
        await cluster.iptables(v, "-F", "OUTPUT")
        return
    if name == "isolate":
        await cluster.iptables(v, "-A", "INPUT", "!", "-i", "lo", "-j", "DROP")
        await cluster.iptables(v, "-A", "OUTPUT", "!", "-o", "lo", "-j", "DROP")
    elif name == "loss":
        for chain, iface in (("INPUT", "-i"), ("OUTPUT", "-o")):
            await cluster.iptables(v, "-A", chain, "!", iface, "lo", "-m", "statistic",
                             "--mode", "random", "--probability", "0.1", "-j", "DROP")
    else:
        for peer in PEERS_OF_VICTIM:
            if name in ("split", "oneway-in"):
                await cluster.iptables(v, "-A", "INPUT", "-s", peer, "-j", "DROP")
            if name in ("split", "oneway-out"):
                await cluster.iptables(v, "-A", "OUTPUT", "-d", peer, "-j", "DROP")


async def scenario(cluster, name, args):
    load = Load(f"{name}-{int(time.time())}", args.rate)
    runner = asyncio.get_running_loop().create_task(load.run())
    await asyncio.sleep(args.warm)
    await fault(cluster, name, True)
    faulted = time.time()
    await asyncio.sleep(args.fault)
    await fault(cluster, name, False)
    healed = time.time()
    converged = None
    deadline = healed + args.heal
    while time.time() < deadline:
        await asyncio.sleep(0.05)
        now = time.time()
        if cluster.agreed(now):
            # The first agreeing instant: the earliest poll time from which all agree.
            converged = now
            break
    await asyncio.sleep(1.0)  # a little load after the ring agrees
    load.stop = True
    await runner
    # Two owners disagreeing: sampled every 50 ms from the fault to the end.
    disagree = 0.0
    t = faulted
    end = time.time()
    while t < end:
        if cluster.owners_disagree(t):
            disagree += 0.05
        t += 0.05
    s = load.samples
    answered = [x for x in s if not x[6]]
    majority = [x for x in answered if x[2] != VICTIM]
    allowed = sum(1 for x in answered if x[4])
    degraded = sum(1 for x in answered if x[5])
    latencies = sorted(x[3] for x in answered)
    row = {
        "scenario": name,
        "checks": len(s),
        "failed": sum(1 for x in s if x[6]),
        "degraded": degraded,
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0.0,
        "slowest_majority_ms": 1000 * max((x[3] for x in majority), default=0.0),
        "slowest_total_ms": 1000 * max((x[1] for x in s), default=0.0),
        "over_admission_pct": 100.0 * (allowed - KEYS * LIMIT) / (KEYS * LIMIT),
        "converged_s": (converged - healed) if converged else None,
        "owners_disagreed_s": disagree,
        "fault_s": healed - faulted,
    }
    with open(os.path.join(args.out, f"samples-{name}.tsv"), "w") as f:
        for x in s:
            f.write("\t".join(str(v) for v in x) + "\n")
    return row


async def orchestrate(args):
    cluster = Cluster(args)
    for i in range(len(NODES)):
        cluster.start_node(i)
    await cluster.start_pollers()
    rows = []
    try:
        if not await cluster.wait_formed():
            print("the cluster did not form within 30 s", file=sys.stderr)
            return 1
        for name in args.scenarios.split():
            if not await cluster.wait_formed():
                print(f"the ring did not agree before {name}", file=sys.stderr)
                return 1
            row = await scenario(cluster, name, args)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        cluster.stop_all()
    print(table(rows))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    if args.check and any(r["failed"] for r in rows):
        print("failed checks: the bench's target is 0", file=sys.stderr)
        return 1
    return 0


def table(rows):
    out = [
        "| scenario | checks | failed | degraded | p99 ms | slowest, majority side ms | slowest with retries ms "
        "| over-admission | ring agrees after heal | owners disagreed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        conv = f"{r['converged_s']:.2f} s" if r["converged_s"] is not None else "not within bound"
        out.append(
            f"| {r['scenario']} | {r['checks']} | {r['failed']} | {r['degraded']} | {r['p99_ms']:.2f} "
            f"| {r['slowest_majority_ms']:.1f} | {r['slowest_total_ms']:.1f} "
            f"| {r['over_admission_pct']:.0f}% | {conv} | {r['owners_disagreed_s']:.2f} s |"
        )
    return "\n".join(out)


async def poll(url):
    host, port = url.rsplit(":", 1)
    conn = Conn(host, int(port))
    while True:
        t = time.time()
        try:
            status, data = await asyncio.wait_for(conn.request("GET", "/v1/cluster"), 0.3)
            v = json.loads(data)
            line = json.dumps({k: v[k] for k in ("ring_members", "quorate", "members") if k in v})
        except Exception:
            conn.close()
            line = "null"
        sys.stdout.write(f"{t} {line}\n")
        sys.stdout.flush()
        await asyncio.sleep(max(0.0, 0.1 - (time.time() - t)))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "poll":
        try:
            asyncio.run(poll(sys.argv[2]))
        except (KeyboardInterrupt, BrokenPipeError):
            pass
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--ns", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenarios", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--rate", type=float, default=float(os.environ.get("RATE", 1000)))
    ap.add_argument("--warm", type=float, default=float(os.environ.get("WARM", 4)))
    ap.add_argument("--fault", type=float, default=float(os.environ.get("FAULT", 8)))
    ap.add_argument("--heal", type=float, default=float(os.environ.get("HEAL", 15)))
    args = ap.parse_args()
    return asyncio.run(orchestrate(args))


if __name__ == "__main__":
    sys.exit(main())
