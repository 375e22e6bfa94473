"""bench/reserve.sh's load: reserve/settle pairs through a 3-node cluster, then expiring
reservations (see bench/reserve.sh for what it reports). Standard library only."""
import http.client
import json
import random
import sys
import threading
import time

ports = [int(p) for p in sys.argv[1].split(",")]
pairs, keys, limit, threads, expiring, ttl_ms, run = map(int, sys.argv[2:9])


def conn(i):
    return http.client.HTTPConnection("127.0.0.1", ports[i % 3], timeout=10)


def post(c, path, body):
    c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read() or b"{}")


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + " "))


# The whole load within one minute of the window.
left = 60 - time.time() % 60
if left < 40:
    print("waiting %.0f s for the next minute" % left, file=sys.stderr)
    time.sleep(left + 0.5)

lock = threading.Lock()
admitted = {}  # key -> tokens its settled reservations came to
overshoot_max = 0
statuses = {}
failures = []
todo = list(range(pairs))


def count(what):
    statuses[what] = statuses.get(what, 0) + 1


def worker(t):
    global overshoot_max
    rng = random.Random(t)
    reserving, settling = {}, {}
    while True:
        with lock:
            if not todo:
                return
            n = todo.pop()
        key = "team:%d:%d" % (run, n % keys)
        estimate = rng.randint(500, 1500)
        actual = int(estimate * rng.uniform(0.5, 1.5))
        node = n % 3
        c = reserving.setdefault(node, conn(node))
        s, v = post(c, "/v1/reserve", {"key": key, "rule": "llm-tokens", "cost": estimate})
        with lock:
            count("reserve %d" % s)
        if s == 429:
            continue
        if s != 200:
            with lock:
                failures.append(("reserve", s, v))
            continue
        # Settled through the next node: the id routes it to the owner.
        c = settling.setdefault(node, conn(node + 1))
        s, w = post(c, "/v1/settle", {"reservation": v["reservation"], "cost": actual})
        with lock:
            count("settle %d" % s)
            if s == 200:
                admitted[key] = admitted.get(key, 0) + actual
                overshoot_max = max(overshoot_max, actual - estimate)
            else:
                failures.append(("settle", s, w))
                admitted[key] = admitted.get(key, 0) + estimate


start = time.time()
ws = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
for w in ws:
    w.start()
for w in ws:
    w.join()
elapsed = time.time() - start
debt = sum(metric(p, "ringlimit_reservation_debt_tokens") for p in ports)
# The nodes' own reading of each key's window (weighted count = limit - remaining).
counted = {}
c = conn(0)
for k in range(keys):
    key = "team:%d:%d" % (run, k)
    s, v = post(c, "/v1/check", {"key": key, "rule": "llm-tokens", "cost": 0})
    counted[key] = limit - v["remaining"]

total = sum(admitted.values())
over = [a - limit for a in admitted.values()]
bound = overshoot_max * threads
print("pairs %d over %d keys in %.1f s (%d requests/s), %d threads"
      % (pairs, keys, elapsed, (sum(statuses.values())) / elapsed, threads))
print("answers: %s" % ", ".join("%s: %d" % kv for kv in sorted(statuses.items())))
print("admitted: %d tokens in all, limit %d per key (%d in all); per key, the most over the "
      "limit: %d; largest single overshoot %d (bound %d = x%d threads)"
      % (total, limit, limit * keys, max(over, default=0), overshoot_max, bound, threads))
print("debt outstanding when the load ended: %d tokens (all nodes)" % debt)
differ = sorted(k for k in counted if counted[k] != admitted.get(k, 0))
print("nodes' window count = client's sum for %d of %d keys%s"
      % (keys - len(differ), keys,
         "" if not differ else " (differ by %s: owed tokens not yet repaid)"
         % [admitted.get(k, 0) - counted[k] for k in differ][:5]))
ok = not failures and all(a <= limit + bound for a in admitted.values())
if failures:
    print("failures: %s" % failures[:5])

# Expiry: reservations never settled leak nothing.
expired_name = 'ringlimit_reservation_results_total{result="expired"}'
expired_before = sum(metric(p, expired_name) for p in ports)
ids = []
c = conn(0)
for n in range(expiring):
    s, v = post(c, "/v1/reserve", {"key": "expiring:%d:%d" % (run, n), "rule": "llm-tokens",
                                   "cost": 10, "ttl_ms": ttl_ms})
    if s == 200:
        ids.append(v["reservation"])
live = sum(metric(p, "ringlimit_reservations") for p in ports)
time.sleep(ttl_ms / 1000 + 0.3)
live_after = sum(metric(p, "ringlimit_reservations") for p in ports)
expired = sum(metric(p, expired_name) for p in ports) - expired_before
s, v = post(conn(1), "/v1/settle", {"reservation": ids[0], "cost": 1}) if ids else (0, {})
print("expiry: %d reserved with ttl_ms %d and never settled: ringlimit_reservations %d -> %d "
      "%.1f s later; expired +%d; a late settle: %d %s"
      % (len(ids), ttl_ms, live, live_after, ttl_ms / 1000 + 0.3, expired, s, v.get("error", "")))
ok = ok and len(ids) == expiring and live_after == 0 and expired == len(ids) and s == 404
print("OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
