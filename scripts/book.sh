#!/usr/bin/env bash
# Builds the user guide (docs/guide, an mdBook) into target/book/ and checks the links of the
# guide, the README and docs/*.md (scripts/check-links.py: files, folders and heading anchors,
# in the repository as well as in the book). mdBook comes from crates.io, pinned, built once into
# a cache folder outside the checkout ($EMBER_TOOLS, default ~/.cache/ember-tools) and reused.
#
# Usage: scripts/book.sh   (then open target/book/index.html)
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION=0.5.4
tools="${EMBER_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/ember-tools}"
root="$tools/mdbook-$MDBOOK_VERSION"
mdbook="$root/bin/mdbook"
if ! "$mdbook" --version >/dev/null 2>&1; then
    echo "installing mdbook $MDBOOK_VERSION from crates.io into $root (once; a few minutes)"
    # Only the renderer and its search index: no file watcher or web server to build.
    cargo install mdbook --locked --version "$MDBOOK_VERSION" --no-default-features \
        --features search --root "$root" --quiet
fi
"$mdbook" --version
"$mdbook" build docs
echo "built the guide into target/book/"
python3 scripts/check-links.py
