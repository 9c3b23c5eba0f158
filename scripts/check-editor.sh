#!/usr/bin/env bash
# Checks what an editor makes of the shipped configs: installs the YAML language server (the
# one VS Code's YAML extension, Neovim, Helix and Zed run) from the npm registry, pinned, into a
# cache folder outside the checkout ($EMBER_TOOLS, default ~/.cache/ember-tools), and drives it
# over LSP with scripts/check-yaml-lsp.js: completion, hover and diagnostics against
# configs/ember.schema.json through each config's `# yaml-language-server: $schema=...` line.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=2.0.0
tools="${EMBER_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/ember-tools}"
prefix="$tools/yaml-language-server-$VERSION"
server="$prefix/node_modules/.bin/yaml-language-server"
if [ ! -x "$server" ]; then
    echo "installing yaml-language-server $VERSION from the npm registry into $prefix"
    npm install --prefix "$prefix" --no-audit --no-fund --silent "yaml-language-server@$VERSION"
fi
node scripts/check-yaml-lsp.js "$server"
