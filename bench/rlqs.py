#!/usr/bin/env python3
"""The table of bench/rlqs.sh, from the simulator's JSON lines (tests/python/rlqs_envoys.py;
standard library only).

  rlqs.py [--check] --run LABEL=FILE ... [--kill-run LABEL=FILE --killed WALL --victim K]

A row per run: admitted ÷ (limit × time) over the run, without its first 2 s, and its busiest
second; the quiet Envoys' (demand under their fair share) worst ratio of admitted to demand over
the run and in a second; assignments, reconnects, protocol errors. Notes: after a demand change,
how long until Envoy 1 was assigned at least half way to its new fair share (and Envoy 0 half
way down); for the --kill-run, killed at unix time WALL with node K's Envoys (i mod 3 == K):
admitted ÷ (limit × time) after the kill, and the slowest of those Envoys' reconnect and new
assignment after the kill. --check: exits 1 when a run is off (admitted beyond ±5%, +15% after a
kill; a quiet Envoy under 90%; a protocol error or a failed stream; a killed node's Envoy never
assigned again).
"""
import argparse
import json
import sys


def load(path):
    lines = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                lines.append(json.loads(line))
    summary = next((x for x in reversed(lines) if x.get("event") == "summary"), None)
    if summary is None:
        sys.exit(f"{path}: no summary line (the simulator did not finish)")
    return lines, summary


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def kill_figures(lines, summary, killed, victim, addrs):
    start = next(x["wall"] for x in lines if x.get("event") == "start")
    t_kill = killed - start
    limit = summary["limit_rate"]
    after = [x["admitted"] for x in lines
             if "event" not in x and x.get("t", -1) >= int(t_kill) + 1]
    ratio = sum(after) / (limit * len(after)) if after else None
    reconnect = assigned = 0.0
    missing = []
    for i in range(summary["envoys"]):
        if i % addrs != victim:
            continue
        moved = next((x["t"] for x in lines if x.get("event") == "reconnect"
                      and x["envoy"] == i and x["t"] >= t_kill - 0.5), None)
        got = None if moved is None else next(
            (x["t"] for x in lines if x.get("event") == "assignment" and x["envoy"] == i
             and x["t"] > moved), None)
        if got is None:
            missing.append(i)
            continue
        reconnect = max(reconnect, moved - t_kill)
        assigned = max(assigned, got - t_kill)
    return t_kill, ratio, reconnect, assigned, missing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="append", default=[], help="LABEL=FILE")
    ap.add_argument("--kill-run", help="LABEL=FILE")
    ap.add_argument("--killed", type=float, help="unix time of the SIGKILL")
    ap.add_argument("--victim", type=int, help="the killed node's index")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    runs = [(r, False) for r in a.run] + ([(a.kill_run, True)] if a.kill_run else [])
    print("| run | admitted ÷ (limit × s) | without the first 2 s | busiest second ÷ limit "
          "| quiet Envoys: worst admitted ÷ demand | worst quiet second | assignments "
          "| reconnects | protocol errors | notes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    failed = []
    for spec, is_kill in runs:
        label, path = spec.rsplit("=", 1)
        lines, s = load(path)
        notes = []
        errors = len(s["protocol_errors"]) + (1 if s.get("stream_failed") else 0)
        if s.get("change_at") is not None:
            notes.append(f"demand change: Envoy 1 half way up "
                         f"({fmt(s.get('change_threshold'), 0)}/s) "
                         f"in {fmt(s.get('change_latency_s'), 2)} s, Envoy 0 half way down "
                         f"({fmt(s.get('change_threshold_down'), 0)}/s) in "
                         f"{fmt(s.get('change_latency_down_s'), 2)} s")
        bound = (0.95, 1.05)
        if is_kill:
            t_kill, after, reconnect, assigned, missing = kill_figures(
                lines, s, a.killed, a.victim, len(s["addrs"]))
            notes.append(f"killed at {t_kill:.1f} s; after it {fmt(after)} × limit; its Envoys "
                         f"saw their streams break within {reconnect:.2f} s, assigned again within "
                         f"{assigned:.2f} s" + (f"; never: Envoys {missing}" if missing else ""))
            bound = (0.85, 1.15)
            if missing:
                failed.append(f"{label}: Envoys {missing} not assigned again after the kill")
            if after is not None and after > 1.15:
                failed.append(f"{label}: {after:.3f} x limit after the kill")
        if s.get("warnings"):
            notes.append("warnings: " + "; ".join(f"{w} (x{n})" for w, n in s["warnings"].items()))
        print(f"| {label} | {fmt(s.get('admitted_ratio'))} | {fmt(s.get('steady_ratio'))} "
              f"| {fmt(s.get('max_second_ratio'))} | {fmt(s.get('quiet_worst_ratio'))} "
              f"| {fmt(s.get('quiet_worst_second'))} | {s['assignments']} | {s['reconnects']} "
              f"| {errors} | {'; '.join(notes)} |")
        ratio = s.get("admitted_ratio")
        if ratio is None or not bound[0] <= ratio <= bound[1]:
            failed.append(f"{label}: admitted {ratio} x limit x time, want {bound}")
        quiet = s.get("quiet_worst_ratio")
        if quiet is not None and quiet < 0.9:
            failed.append(f"{label}: a quiet Envoy got {quiet} of its demand")
        if errors:
            failed.append(f"{label}: {errors} protocol errors or failed streams")
    if a.check and failed:
        for f in failed:
            print(f"CHECK FAILED: {f}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
