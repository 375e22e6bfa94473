#!/usr/bin/env python3
"""The scale bench's orchestrator and load generator (see bench/scale.sh, which builds the binary,
picks the settings and cleans up after this; every setting comes from the environment).

  scale.py run                                  # the whole bench: SIZES, phases, convergence
  scale.py load OUT_DIR KEYS STATS PORT...      # the load loop (a process of its own, so its
                                                # CPU and GIL stay out of the orchestrator's way)
"""

import http.client
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

HOST = "127.0.0.1"
RULE = "hot-global"
RULES_YAML = """rules:
  - name: hot-global
    limit: 1000000
    period: 1m
    algorithm: sliding_window
    mode: global
"""
POLL_S = 0.05
BATCH = 1000


def log(msg):
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def out(line=""):
    """A line of the tables: on stdout and in OUT_DIR/summary.txt."""
    print(line, flush=True)
    with open(os.path.join(os.environ["OUT_DIR"], "summary.txt"), "a") as f:
        f.write(line + "\n")


def http_get(port, path, timeout=2.0):
    """(status, body) of one GET; (None, None) when the node does not answer."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException):
        return None, None
    finally:
        conn.close()


def cluster(port):
    status, body = http_get(port, "/v1/cluster", timeout=1.0)
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def states(view):
    return {m["node_id"]: m["state"] for m in view.get("members", [])}


# ---------------------------------------------------------------------------------------------
# Load generator


def load_main(argv):
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _out_dir, keys, stats_path, ports = argv[0], int(argv[1]), argv[2], [int(p) for p in argv[3:]]
    n = len(ports)
    # The keys in n chunks; chunk c goes to node (c + tick) % n, so each second every key is
    # checked once in total and over n seconds every node has checked every key.
    size = math.ceil(keys / n)
    bodies = []
    for c in range(n):
        lo, hi = c * size, min(keys, (c + 1) * size)
        batches = []
        for s in range(lo, hi, BATCH):
            items = ",".join('{"key":"g%d","rule":"%s"}' % (j, RULE) for j in range(s, min(hi, s + BATCH)))
            batches.append((min(hi, s + BATCH) - s, ('{"checks":[%s]}' % items).encode()))
        bodies.append(batches)
    conns = [None] * n
    stats = {"keys": keys, "nodes": n, "ticks": 0, "late_ticks": 0, "sent": 0, "allowed": 0,
             "errors": 0, "max_tick_s": 0.0}

    def send(i, count, body):
        for attempt in (0, 1):
            if conns[i] is None:
                conns[i] = http.client.HTTPConnection(HOST, ports[i], timeout=10)
            try:
                conns[i].request("POST", "/v1/check/batch", body, {"content-type": "application/json"})
                r = conns[i].getresponse()
                data = r.read()
                if r.status != 200:
                    stats["errors"] += 1
                    return
                stats["sent"] += count
                stats["allowed"] += data.count(b'"allowed":true')
                return
            except (OSError, http.client.HTTPException):
                conns[i].close()
                conns[i] = None
                if attempt:
                    stats["errors"] += 1

    t0 = time.monotonic()
    tick = 0
    while True:
        start = time.monotonic()
        for c in range(n):
            for count, body in bodies[c]:
                send((c + tick) % n, count, body)
        tick += 1
        took = time.monotonic() - start
        stats["ticks"] = tick
        stats["max_tick_s"] = round(max(stats["max_tick_s"], took), 3)
        tmp = stats_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f)
        os.replace(tmp, stats_path)
        now = time.monotonic()
        due = t0 + tick
        if now > due:  # overran its second: start the next one now, no catching up
            stats["late_ticks"] += 1
            t0 = now - tick
        else:
            time.sleep(due - now)


# ---------------------------------------------------------------------------------------------
# Orchestrator


class Bench:
    def __init__(self):
        env = os.environ
        self.bin = env["BIN"]
        self.out = env["OUT_DIR"]
        self.sizes = [int(s) for s in env.get("SIZES", "3 9 25").split()]
        self.window = float(env.get("WINDOW", "10"))
        self.settle = float(env.get("SETTLE", "5"))
        self.hot = [int(k) for k in env.get("HOT_KEYS", "1000 10000").split()]
        self.base = int(env.get("BASE", "30000"))
        self.timeout = float(env.get("WAIT_TIMEOUT", "60"))
        self.leave = env.get("LEAVE", "1") == "1"
        self.converge_idle = env.get("CONVERGE_IDLE", "1") == "1" and bool(self.hot)
        self.tck = os.sysconf("SC_CLK_TCK")
        self.procs = {}  # node index -> Popen
        self.loadgen = None
        self.results = open(os.path.join(self.out, "results.jsonl"), "a")
        self.rows = []
        self.conv = []
        self.false_deaths = {}
        self.formed = None
        self.ports = {}  # node index -> (http, peer), per size
        self.next_port = self.base
        self.rules = os.path.join(self.out, "rules.yaml")
        with open(self.rules, "w") as f:
            f.write(RULES_YAML)

    def http_port(self, i):
        return self.ports[i][0]

    def peer_port(self, i):
        return self.ports[i][1]

    def record(self, obj):
        self.results.write(json.dumps(obj) + "\n")
        self.results.flush()

    def note_pid(self, pid):
        with open(os.path.join(self.out, "pids"), "a") as f:
            f.write(f"{pid}\n")

    # -- processes --

    @staticmethod
    def port_free(port, kinds):
        for kind in kinds:
            s = socket.socket(socket.AF_INET, kind)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((HOST, port))
            except OSError:
                return False
            finally:
                s.close()
        return True

    def alloc_ports(self, i):
        """Node i's HTTP and peer ports: BASE+2i and BASE+2i+1 when free, else the next free
        pair above the last one given out: another program can hold one (bench/scale.sh's BASE
        is below the ephemeral range, where the client side of a connection, TIME-WAIT
        included, could hold one for a minute)."""
        cand = max(self.base + 2 * i, self.next_port)
        while cand < self.base + 2000:
            if self.port_free(cand, (socket.SOCK_STREAM,)) and \
                    self.port_free(cand + 1, (socket.SOCK_STREAM, socket.SOCK_DGRAM)):
                self.ports[i] = (cand, cand + 1)
                self.next_port = cand + 2
                if cand != self.base + 2 * i:
                    log(f"n{i}: ports {self.base + 2 * i}-{self.base + 2 * i + 1} busy, using {cand}-{cand + 1}")
                return
            cand += 2
        raise RuntimeError(f"no free port pair on {HOST} from {self.base} (set BASE)")

    def start_node(self, i, size):
        self.alloc_ports(i)
        logdir = os.path.join(self.out, "logs")
        os.makedirs(logdir, exist_ok=True)
        env = dict(os.environ, RUST_LOG="warn", TOKIO_WORKER_THREADS="1")
        with open(os.path.join(logdir, f"size{size}-n{i}.log"), "w") as err:
            p = subprocess.Popen(
                [self.bin, "serve", "--node-id", f"n{i}",
                 "--http", f"{HOST}:{self.http_port(i)}", "--peer", f"{HOST}:{self.peer_port(i)}",
                 "--seeds", f"{HOST}:{self.peer_port(0)}", "--config", self.rules,
                 "--http-threads", "1", "--max-keys", "100000"],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        self.procs[i] = p
        self.note_pid(p.pid)
        return p

    def stop(self, procs, sig=signal.SIGTERM, grace=10.0):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def stop_all(self):
        self.stop_load()
        self.stop(list(self.procs.values()))
        self.procs = {}

    def start_load(self, keys, nodes):
        stats = os.path.join(self.out, f"load-{len(nodes)}-{keys}.json")
        self.loadgen = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "load", self.out, str(keys), stats]
            + [str(self.http_port(i)) for i in nodes],
            stdin=subprocess.DEVNULL)
        self.note_pid(self.loadgen.pid)
        return stats

    def stop_load(self):
        if self.loadgen is not None:
            self.stop([self.loadgen], grace=5.0)
            self.loadgen = None

    # -- measurements --

    def cpu_ticks(self, i):
        with open(f"/proc/{self.procs[i].pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15

    @staticmethod
    def udp_drops():
        """Datagrams dropped by the kernel per local 127.0.0.1 UDP port (a full receive buffer)."""
        drops = {}
        with open("/proc/net/udp") as f:
            next(f)
            for line in f:
                fields = line.split()
                addr, port = fields[1].split(":")
                if addr == "0100007F":
                    drops[int(port, 16)] = int(fields[-1])
        return drops

    def snapshot(self, nodes):
        """Per node (time, CPU ticks, UDP drops, metrics), None for a node that did not answer."""
        snap = {}
        for i in nodes:
            body = None
            for _attempt in range(3):
                if self.procs[i].poll() is not None:
                    break
                status, body = http_get(self.http_port(i), "/metrics", timeout=10.0)
                if status == 200:
                    break
                body = None
            if body is None:
                log(f"n{i}: no answer to GET /metrics (exit code {self.procs[i].poll()}); left out")
                snap[i] = None
                continue
            t = time.monotonic()
            try:
                ticks = self.cpu_ticks(i)
            except OSError:
                snap[i] = None
                continue
            drops = self.udp_drops().get(self.peer_port(i), 0)
            vals = {}
            for line in body.decode().splitlines():
                if not line.startswith(("ringlimit_gossip_", "ringlimit_global_", "ringlimit_checks_total")):
                    continue
                key, _, value = line.rpartition(" ")
                try:
                    vals[key] = float(value)
                except ValueError:
                    pass
            snap[i] = (t, ticks, drops, vals)
        return snap

    def measure(self, size, phase, keys, nodes, load_stats=None):
        a = self.snapshot(nodes)
        time.sleep(self.window)
        b = self.snapshot(nodes)
        per_node = []
        missing = [f"n{i}" for i in nodes if a[i] is None or b[i] is None]
        checks = 0.0
        for i in nodes:
            if a[i] is None or b[i] is None:
                continue
            (ta, ca, da, va), (tb, cb, db, vb) = a[i], b[i]
            dt = tb - ta

            def rate(key):
                return (vb.get(key, 0.0) - va.get(key, 0.0)) / dt

            checks += sum(vb[k] - va.get(k, 0.0) for k in vb
                          if k.startswith("ringlimit_checks_total") and 'mode="global"' in k) / dt
            per_node.append({
                "node": f"n{i}",
                "window_s": dt,
                # Gossip (UDP) plus global counts pushed over the peer link (TCP payload;
                # zero on builds that still carried counts in gossip).
                "sent_Bps": rate('ringlimit_gossip_bytes_total{direction="sent"}')
                + rate("ringlimit_global_sent_bytes_total"),
                "recv_Bps": rate('ringlimit_gossip_bytes_total{direction="received"}')
                + rate("ringlimit_global_received_bytes_total"),
                "gossip_sent_Bps": rate('ringlimit_gossip_bytes_total{direction="sent"}'),
                "gossip_recv_Bps": rate('ringlimit_gossip_bytes_total{direction="received"}'),
                "sent_dgps": rate('ringlimit_gossip_datagrams_total{direction="sent"}'),
                "recv_dgps": rate('ringlimit_gossip_datagrams_total{direction="received"}'),
                "udp_drops_ps": (db - da) / dt,
                "cpu_pct": (cb - ca) / self.tck / dt * 100.0,
                "global_end": {k: v for k, v in vb.items() if k.startswith("ringlimit_global_")},
            })
        if not per_node:
            raise RuntimeError(f"size {size}, {phase}: no node answered GET /metrics")
        summary = {"measured_nodes": len(per_node), "missing": missing}
        for field in ("sent_Bps", "recv_Bps", "gossip_sent_Bps", "gossip_recv_Bps", "cpu_pct",
                      "sent_dgps", "recv_dgps", "udp_drops_ps"):
            vals = [p[field] for p in per_node]
            summary[field] = {"median": statistics.median(vals), "max": max(vals), "sum": sum(vals)}
        load = None
        if load_stats and os.path.exists(load_stats):
            with open(load_stats) as f:
                load = json.load(f)
        self.record({"kind": "phase", "nodes": size, "phase": phase, "hot_keys": keys,
                     "window_s": self.window, "settle_s": self.settle, "checks_per_s": checks,
                     "summary": summary, "load": load, "per_node": per_node})
        row = (size, phase, summary, checks)
        self.rows.append(row)
        out(format_row(row))
        if load and (load["errors"] or load["late_ticks"]):
            log(f"load: {load['errors']} failed batches, {load['late_ticks']} of {load['ticks']} "
                f"seconds overran (longest {load['max_tick_s']} s)")

    # -- waits --

    def poll(self, nodes, preds, t0, what):
        """Polls each node's /v1/cluster every 50 ms until every predicate holds on every node
        (a node leaves the poll once all hold on it); returns {pred: {node: seconds since t0}},
        None for a node where it did not hold within the timeout."""
        done = {name: {} for name in preds}
        pending = set(nodes)
        deadline = t0 + self.timeout
        while pending and time.monotonic() < deadline:
            tick = time.monotonic()
            for i in sorted(pending):
                view = cluster(self.http_port(i))
                if view is None:
                    continue
                now = time.monotonic()
                for name, pred in preds.items():
                    if i not in done[name] and pred(i, view):
                        done[name][i] = now - t0
                if all(i in done[name] for name in preds):
                    pending.discard(i)
            time.sleep(max(0.0, tick + POLL_S - time.monotonic()))
        if pending:
            log(f"{what}: not within {self.timeout:.0f} s on n{', n'.join(map(str, sorted(pending)))}")
        return {name: {f"n{i}": d.get(i) for i in nodes} for name, d in done.items()}

    @staticmethod
    def worst(times):
        vals = list(times.values())
        return None if not vals or None in vals else max(vals)

    def wait_formed(self, n):
        t0 = time.monotonic()
        deadline = t0 + self.timeout
        for i in range(n):
            while http_get(self.http_port(i), "/readyz", timeout=1.0)[0] != 200:
                if self.procs[i].poll() is not None:
                    raise RuntimeError(f"n{i} exited ({self.procs[i].returncode}); see logs/")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"n{i} not ready within {self.timeout:.0f} s")
                time.sleep(POLL_S)
        want = {f"n{j}" for j in range(n)}
        res = self.poll(range(n), {"all_alive": lambda i, v: all(
            states(v).get(m) == "alive" for m in want)}, t0, f"cluster of {n}")
        if self.worst(res["all_alive"]) is None:
            raise RuntimeError(f"cluster of {n} did not form within {self.timeout:.0f} s")
        return time.monotonic() - t0

    # -- the bench --

    def size(self, n):
        self.ports, self.next_port = {}, self.base
        log(f"size {n}: starting {n} nodes (ports from {self.base})")
        for i in range(n):
            self.start_node(i, n)
        formed = self.formed = self.wait_formed(n)
        log(f"size {n}: formed in {formed:.2f} s; idle: settle {self.settle:g} s, window {self.window:g} s")
        nodes = list(range(n))
        time.sleep(self.settle)
        self.measure(n, "idle", 0, nodes)
        if self.converge_idle:
            self.convergence(n, "idle", n, leave=False)
        for keys in self.hot:
            log(f"size {n}: {keys} hot global keys: settle {self.settle:g} s, window {self.window:g} s")
            stats = self.start_load(keys, nodes)
            time.sleep(self.settle)
            if self.loadgen.poll() is not None:
                raise RuntimeError("the load generator exited")
            self.measure(n, f"hot-{keys}", keys, nodes, stats)
            self.stop_load()
        self.convergence(n, "after-hot" if self.hot else "idle", n + 1, leave=self.leave)
        log(f"size {n}: stopping")
        self.stop_all()
        self.false_deaths[n] = self.count_false_deaths(n)

    def count_false_deaths(self, n):
        """Times a node logged a member it never stopped (n0 .. n(n-2): not the node that left,
        not the ones that joined and were killed) as declared dead, summed over the nodes."""
        never_stopped = {f"n{i}" for i in range(n - 1)}
        logdir = os.path.join(self.out, "logs")
        count = 0
        for name in os.listdir(logdir):
            if not name.startswith(f"size{n}-"):
                continue
            with open(os.path.join(logdir, name), errors="replace") as f:
                for line in f:
                    if "member declared dead" in line:
                        m = line.rstrip().rsplit("member=", 1)
                        if len(m) == 2 and m[1].split()[0] in never_stopped:
                            count += 1
        self.record({"kind": "false_deaths", "nodes": n, "count": count})
        return count

    def convergence(self, n, when, new, leave):
        """Join of node `new`, then its SIGKILL, then (if leave) the SIGTERM of n(n-1)."""
        name = f"n{new}"
        live = sorted(self.procs)
        rec = {"kind": "convergence", "nodes": n, "when": when, "formed_s": self.formed}
        # (a) join: one more node, seeded with n0, until every node (itself too) lists it alive.
        log(f"size {n}, {when}: join of {name}")
        t0 = time.monotonic()
        self.start_node(new, n)
        want = {f"n{j}" for j in live + [new]}
        res = self.poll(live + [new], {
            "listed": lambda i, v: states(v).get(name) == "alive",
            "full_view": lambda i, v: all(states(v).get(m) == "alive" for m in want),
        }, t0, f"join of {name}")
        rec["join"] = res
        rec["join_s"] = self.worst(res["listed"])
        rec["join_full_view_s"] = self.worst(res["full_view"])
        time.sleep(1.0)
        # (b) SIGKILL the node that joined, until no other node counts it alive.
        log(f"size {n}, {when}: SIGKILL of {name}")
        t0 = time.monotonic()
        p = self.procs.pop(new)
        p.kill()
        p.wait(timeout=10)
        res = self.poll(live, {
            "not_alive": lambda i, v: states(v).get(name) != "alive",
        }, t0, f"kill of {name}")
        rec["kill"] = res
        rec["kill_detected_s"] = self.worst(res["not_alive"])
        # (c) SIGTERM the last original node (graceful leave), until no other node counts it
        # alive (`leaving` counts: it is out of the ring), and until each has it dead or absent.
        rec["leave_s"] = rec["leave_gone_s"] = None
        if leave and n >= 2:
            victim = n - 1
            vname = f"n{victim}"
            time.sleep(1.0)
            log(f"size {n}, {when}: SIGTERM of {vname}")
            t0 = time.monotonic()
            p = self.procs.pop(victim)
            p.terminate()
            res = self.poll([i for i in live if i != victim], {
                "not_alive": lambda i, v: states(v).get(vname) != "alive",
                "gone": lambda i, v: states(v).get(vname, "dead") == "dead",
            }, t0, f"leave of {vname}")
            rec["leave"] = res
            rec["leave_s"] = self.worst(res["not_alive"])
            rec["leave_gone_s"] = self.worst(res["gone"])
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
            rec["leave_exit_code"] = p.returncode
        self.record(rec)
        self.conv.append(rec)

    def run(self):
        log(f"BIN={self.bin} SIZES='{' '.join(map(str, self.sizes))}' WINDOW={self.window:g} "
            f"SETTLE={self.settle:g} HOT_KEYS='{' '.join(map(str, self.hot))}' BASE={self.base} "
            f"OUT_DIR={self.out}")
        out(HEADER)
        for n in self.sizes:
            self.size(n)
        out()
        out(f"{'nodes':>5}  {'when':<10}  {'join_s':>7}  {'kill_detected_s':>15}  {'leave_s':>7}")
        for c in self.conv:
            out(f"{c['nodes']:>5}  {c['when']:<10}  {fmt_s(c['join_s']):>7}  "
                f"{fmt_s(c['kill_detected_s']):>15}  {fmt_s(c['leave_s']):>7}")
        out()
        out(f"{'nodes':>5}  {'false_deaths':>12}   (never-stopped members declared dead, all logs)")
        for n, count in self.false_deaths.items():
            out(f"{n:>5}  {count:>12}")


HEADER = (f"{'nodes':>5}  {'phase':<10}  {'peer_sent_B/s(median,max)':>27}  "
          f"{'peer_recv_B/s(median,max)':>27}  {'cpu_%(median,max)':>17}  {'checks/s':>8}  "
          f"{'udp_drops/s':>11}")


def format_row(row):
    size, phase, s, checks = row

    def pair(field, fmt):
        return f"{fmt.format(s[field]['median'])},{fmt.format(s[field]['max'])}"

    return (f"{size:>5}  {phase:<10}  {pair('sent_Bps', '{:.0f}'):>27}  "
            f"{pair('recv_Bps', '{:.0f}'):>27}  {pair('cpu_pct', '{:.1f}'):>17}  {checks:>8.0f}  "
            f"{s['udp_drops_ps']['sum']:>11.0f}"
            + (f"  ({s['measured_nodes']} nodes answered)" if s["missing"] else ""))


def fmt_s(v):
    return "-" if v is None else f"{v:.2f}"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "load":
        load_main(sys.argv[2:])
        return
    bench = Bench()

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        bench.run()
    except RuntimeError as e:
        log(f"failed: {e}")
        sys.exit(1)
    finally:
        # Nothing outlives the bench, whatever ends it.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        bench.stop_load()
        bench.stop(list(bench.procs.values()), grace=5.0)


if __name__ == "__main__":
    main()
