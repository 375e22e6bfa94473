#!/usr/bin/env python3
"""The soak (see bench/soak.sh): 3 nodes on 127.0.0.1 for MINUTES with owner and global rules and
several limits per request, one node killed (SIGKILL) and restarted every KILL_EVERY seconds.

  soak.py --bin B --out DIR [--minutes 30] [--kill-every 180] [--rate 600]

Each request goes to the next node in turn and, unanswered within 250 ms, to the next (a client
with a list of nodes). 70% are POST /v1/check/all with three limits (per-user and per-ip, owner
mode; api, global), 30% a POST /v1/check of the per-user limit alone. Per minute: requests,
errors (no node answered, or a status other than 200/429), p50/p99, degraded answers, RSS of
each node. At the end: over-admission of the owner rules against their bounds (burst plus what
refilled since the first request), and of the global rule per second.
"""

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import Conn, paced, stop_processes  # noqa: E402  (shared with the fault bench)

NODES = 3
USERS = 2000
IPS = 200
RULES = """rules:
  - { name: per-user, limit: 60, period: 1h }
  - { name: per-ip, limit: 600, period: 1h, algorithm: sliding_window }
  - { name: api, limit: 400, period: 1s, algorithm: fixed_window, mode: global }
"""
USER_LIMIT, USER_PERIOD_S = 60, 3600
IP_LIMIT = 600
API_LIMIT = 400
TRY_TIMEOUT = 0.25


# Below Linux's ephemeral range (32768-60999): a restarted node must find its ports free, and
# the load's own client connections take ports from that range (a soak run lost node 1 for 24
# minutes when its HTTP port was taken by one). bench/soak.sh passes its BASE_PORT (bench/lib.sh's
# table and port layout).
BASE_PORT = int(os.environ.get("BASE_PORT", "28700"))


def http_port(i):
    return BASE_PORT + i


def peer_port(i):
    return BASE_PORT + 50 + i


def proc_cpu_s(pid):
    """utime + stime of a process so far, in seconds (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def host_steal_s():
    """CPU time the hypervisor gave to others while this machine's CPUs wanted it (all CPUs)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


class Cluster:
    def __init__(self, args):
        self.args = args
        self.procs = [None] * NODES
        self.rules = os.path.join(args.out, "rules.yaml")
        with open(self.rules, "w") as f:
            f.write(RULES)

    def start(self, i):
        seeds = ",".join(f"127.0.0.1:{peer_port(j)}" for j in range(NODES))
        log = open(os.path.join(self.args.out, f"node-{i}.log"), "ab")
        self.procs[i] = subprocess.Popen(
            [self.args.bin, "serve", "--node-id", f"soak-{i}",
             "--http", f"127.0.0.1:{http_port(i)}", "--peer", f"127.0.0.1:{peer_port(i)}",
             "--seeds", seeds, "--config", self.rules],
            stdout=subprocess.DEVNULL, stderr=log,
            env=dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info")),
        )

    def rss_mib(self, i):
        p = self.procs[i]
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS"):
                        return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            pass
        return 0.0

    def stop(self):
        stop_processes(self.procs)


class Soak:
    def __init__(self, args, cluster):
        self.args, self.cluster = args, cluster
        self.stop = False
        self.t0 = time.monotonic()
        self.minutes = collections.defaultdict(lambda: {"n": 0, "errors": 0, "degraded": 0, "lat": []})
        self.user_admitted = collections.Counter()
        self.ip_admitted = collections.Counter()
        self.api_admitted = collections.Counter()  # by whole second since t0 (wall clock)
        self.first_use = {}
        self.events = []

    async def one(self, conns, first, rng):
        user = f"user:{rng.randrange(USERS)}"
        if rng.random() < 0.7:
            ip = f"ip:{rng.randrange(IPS)}"
            path, body = "/v1/check/all", {"checks": [
                {"key": user, "rule": "per-user"}, {"key": ip, "rule": "per-ip"},
                {"key": "api", "rule": "api"}]}
        else:
            ip, path, body = None, "/v1/check", {"key": user, "rule": "per-user"}
        data = json.dumps(body).encode()
        start = time.monotonic()
        for k in range(NODES):
            n = (first + k) % NODES
            try:
                status, reply = await asyncio.wait_for(
                    conns[n].request("POST", path, data), TRY_TIMEOUT)
                if status not in (200, 429):
                    raise ValueError(status)
                a = json.loads(reply)
                return start, time.monotonic() - start, a, user, ip
            except Exception:
                conns[n].close()
        return start, time.monotonic() - start, None, user, ip

    async def worker(self, w):
        conns = [Conn("127.0.0.1", http_port(i)) for i in range(NODES)]
        rng = random.Random(w)
        k = w
        async for _ in paced(self.args.workers / self.args.rate, rng, lambda: not self.stop):
            start, latency, a, user, ip = await self.one(conns, k % NODES, rng)
            k += 1
            m = self.minutes[int((start - self.t0) // 60)]
            m["n"] += 1
            if a is None:
                m["errors"] += 1
                continue
            m["lat"].append(latency)
            m["degraded"] += bool(a.get("degraded"))
            self.first_use.setdefault(user, start)
            if a["allowed"]:
                self.user_admitted[user] += 1
                if ip is not None:
                    self.first_use.setdefault(ip, start)
                    self.ip_admitted[ip] += 1
                    self.api_admitted[int(time.time())] += 1
        for c in conns:
            c.close()

    async def killer(self):
        k = 0
        while not self.stop:
            await asyncio.sleep(self.args.kill_every)
            if self.stop:
                return
            i = k % NODES
            k += 1
            self.cluster.procs[i].send_signal(signal.SIGKILL)
            self.cluster.procs[i].wait()
            self.events.append((time.monotonic() - self.t0, f"killed node {i}"))
            await asyncio.sleep(5)
            # A restart that exits at once (its port taken) is reported and tried again, not
            # left to run the rest of the soak with two nodes unnoticed.
            for attempt in range(10):
                self.cluster.start(i)
                await asyncio.sleep(1)
                if self.cluster.procs[i].poll() is None:
                    break
                self.events.append((time.monotonic() - self.t0, f"node {i} failed to restart"))
            self.events.append((time.monotonic() - self.t0, f"restarted node {i}"))

    async def resources(self):
        """RSS of each node (last sample of each minute) and CPU time each node and this load
        generator spent in each minute (a node restarted within the minute counts from zero),
        then the host's steal time: the same work taking more CPU time in a minute with no steal
        is the host's other tenants slowing these CPUs, not the nodes doing more."""
        self.rss_by_minute = {}
        self.cpu_by_minute = collections.defaultdict(lambda: [0.0] * (NODES + 2))

        def pids():
            return [p.pid for p in self.cluster.procs] + [os.getpid()]

        steal = host_steal_s()
        last = [(pid, proc_cpu_s(pid)) for pid in pids()]
        while not self.stop:
            await asyncio.sleep(5)
            minute = int((time.monotonic() - self.t0) // 60)
            self.rss_by_minute[minute] = [round(self.cluster.rss_mib(i), 1) for i in range(NODES)]
            for i, pid in enumerate(pids()):
                now = proc_cpu_s(pid)
                before = last[i][1] if last[i][0] == pid else 0.0
                self.cpu_by_minute[minute][i] += max(0.0, now - before)
                last[i] = (pid, now)
            now = host_steal_s()
            self.cpu_by_minute[minute][NODES + 1] += now - steal
            steal = now

    async def run(self):
        tasks = [asyncio.create_task(self.worker(w)) for w in range(self.args.workers)]
        side = [asyncio.create_task(self.killer()), asyncio.create_task(self.resources())]
        await asyncio.sleep(self.args.minutes * 60)
        self.stop = True
        await asyncio.gather(*tasks)
        for t in side:
            t.cancel()


def pct(xs, q):
    xs = sorted(xs)
    return xs[int(q * (len(xs) - 1))] * 1000 if xs else 0.0


def over(admitted, first_use, end, limit, period_s):
    """Admissions beyond burst + refill since the key's first use, over the bounds, in %."""
    extra = bound_sum = 0
    for key, n in admitted.items():
        bound = limit + limit * (end - first_use[key]) / period_s
        bound_sum += bound
        extra += max(0.0, n - bound)
    return 100.0 * extra / bound_sum if bound_sum else 0.0


async def main_async(args):
    cluster = Cluster(args)
    for i in range(NODES):
        cluster.start(i)
    await asyncio.sleep(3)
    soak = Soak(args, cluster)
    try:
        await soak.run()
    finally:
        cluster.stop()
    end = time.monotonic()
    rows = []
    for minute in sorted(soak.minutes):
        m = soak.minutes[minute]
        rows.append({
            "minute": minute, "requests": m["n"], "errors": m["errors"],
            "degraded": m["degraded"], "p50_ms": round(pct(m["lat"], 0.5), 2),
            "p99_ms": round(pct(m["lat"], 0.99), 2),
            "rss_mib": soak.rss_by_minute.get(minute, []),
            # CPU seconds in the minute: nodes 0-2, the load generator itself, the host's steal.
            "cpu_s": [round(c, 1) for c in soak.cpu_by_minute.get(minute, [])],
        })
    api_over = sum(max(0, n - API_LIMIT) for n in soak.api_admitted.values())
    api_total = sum(soak.api_admitted.values())
    summary = {
        "minutes": args.minutes,
        "requests": sum(r["requests"] for r in rows),
        "errors": sum(r["errors"] for r in rows),
        "degraded": sum(r["degraded"] for r in rows),
        "p99_ms_worst_minute": max((r["p99_ms"] for r in rows), default=0),
        "over_admission_per_user_pct": round(over(soak.user_admitted, soak.first_use, end,
                                                  USER_LIMIT, USER_PERIOD_S), 2),
        "over_admission_per_ip_pct": round(over(soak.ip_admitted, soak.first_use, end,
                                                IP_LIMIT, USER_PERIOD_S), 2),
        "api_seconds_over_limit": sum(1 for n in soak.api_admitted.values() if n > API_LIMIT),
        "api_over_admission_pct": round(100.0 * api_over / api_total, 2) if api_total else 0.0,
        "events": soak.events,
    }
    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump({"rows": rows, "summary": summary}, f, indent=1)
    print("| minute | requests | errors | degraded | p50 ms | p99 ms | RSS MiB (n0 n1 n2) "
          "| CPU s (n0 n1 n2 load steal) |")
    print("|---:|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        print(f"| {r['minute']} | {r['requests']} | {r['errors']} | {r['degraded']} "
              f"| {r['p50_ms']} | {r['p99_ms']} | {' '.join(map(str, r['rss_mib']))} "
              f"| {' '.join(map(str, r['cpu_s']))} |")
    print(json.dumps(summary, indent=1))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--kill-every", type=float, default=180)
    ap.add_argument("--rate", type=float, default=600)
    ap.add_argument("--workers", type=int, default=16)
    return asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
