#!/usr/bin/env bash
# Checks the alerts and the dashboard offline:
#   1. deploy/k8s/prometheusrule.yaml is ringlimit.rules.yaml wrapped as a PrometheusRule
#      (`deploy/prometheus/check.sh --write` regenerates it: edit the plain file, not that one);
#   2. `promtool check rules` on the plain file and on the PrometheusRule's spec;
#   3. `promtool test rules` on ringlimit.rules.test.yaml (every alert fires, and stays quiet);
#   4. the Grafana dashboard is JSON.
# What promtool cannot see (every expression of the alerts and the dashboard run against a real
# Prometheus scraping a real 3-node cluster, every metric they name exported) is the test
# `cargo test -p ringlimit-tests --test it prometheus::`.
# Needs promtool (Debian: apt-get install prometheus) and python3.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
plain="$here/ringlimit.rules.yaml"
wrapped="$top/deploy/k8s/prometheusrule.yaml"

fail() {
  echo "deploy/prometheus: $*" >&2
  exit 1
}

# The PrometheusRule: a fixed head, then the plain file from `groups:` on, indented under spec.
generate() {
  cat <<'HEAD'
# GENERATED from deploy/prometheus/ringlimit.rules.yaml by `deploy/prometheus/check.sh --write`:
# edit that file, then regenerate (CI fails while the two differ).
#
# The ringlimit alerts for the Prometheus Operator. Not in kustomization.yaml: the
# PrometheusRule CRD is not among the Kubernetes schemas validate.sh checks against, and not
# every cluster has it. Apply it beside the base, in the ringlimit pods' namespace:
#   kubectl apply -n <namespace> -f deploy/k8s/prometheusrule.yaml
# Prometheus must select it (its ruleSelector, often a `release: <name>` label) and scrape the
# pods in a job whose name contains `ringlimit` (RinglimitNodeDown reads `up` of that job).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: ringlimit
  labels:
    app.kubernetes.io/name: ringlimit
    app.kubernetes.io/part-of: ringlimit
spec:
HEAD
  sed -n '/^groups:/,$p' "$plain" | sed 's/^\(.\)/  \1/'
}

command -v promtool >/dev/null || fail "promtool not found (Debian: apt-get install prometheus)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "${1:-}" = "--write" ]; then
  generate >"$wrapped"
  echo "wrote ${wrapped#"$top"/}"
fi

# 1. In sync.
generate >"$work/expected.yaml"
if ! diff -u "$work/expected.yaml" "$wrapped" >"$work/diff"; then
  cat "$work/diff" >&2
  fail "deploy/k8s/prometheusrule.yaml differs from ringlimit.rules.yaml: run deploy/prometheus/check.sh --write"
fi
echo "deploy/k8s/prometheusrule.yaml: the same rules as ringlimit.rules.yaml"

# 2. Valid rules, both forms.
promtool check rules "$plain"
sed -n '/^spec:/,$p' "$wrapped" | sed '1d; s/^  //' >"$work/spec.yaml"
promtool check rules "$work/spec.yaml"

# 3. Unit tests (run where the test file is: it names the rules file relative to itself).
(cd "$here" && promtool test rules ringlimit.rules.test.yaml)

# 4. The dashboard parses.
python3 -m json.tool "$top/deploy/grafana/ringlimit-dashboard.json" >/dev/null ||
  fail "deploy/grafana/ringlimit-dashboard.json is not JSON"
echo "deploy/grafana/ringlimit-dashboard.json: JSON"
echo "deploy/prometheus: valid"
