#!/usr/bin/env bash
# The chat page's libraries, as package-lock.json pins them, copied into vendor/: the browser
# build and the licences of what it bundles. vendor/ is committed, so building the binary
# needs no npm; this script is how it changes, and how CI checks it was not edited by hand.
#
#   server/webui/vendor.sh          refresh vendor/ from the lockfile (after editing
#                                   package.json: npm install --package-lock-only first)
#   server/webui/vendor.sh --check  exit 1 if vendor/ differs from the lockfile's packages
#
# npm ci runs in a temporary copy (no node_modules/ here) with install scripts off.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
check=false
case "${1:-}" in
    --check) check=true ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$here/package.json" "$here/package-lock.json" "$here/.npmrc" "$tmp/"
(cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)

# What the page loads, and the licence of each package in markdown-it's browser bundle.
modules="$tmp/node_modules"
out="$tmp/vendor"
mkdir -p "$out/licenses"
cp "$modules/markdown-it/dist/browser/markdown-it.umd.min.js" "$out/markdown-it.min.js"
cp "$modules/markdown-it/LICENSE" "$out/licenses/markdown-it.txt"
cp "$modules/entities/LICENSE" "$out/licenses/entities.txt"
cp "$modules/linkify-it/LICENSE" "$out/licenses/linkify-it.txt"
cp "$modules/mdurl/LICENSE" "$out/licenses/mdurl.txt"
cp "$modules/punycode.js/LICENSE-MIT.txt" "$out/licenses/punycode.js.txt"
cp "$modules/uc.micro/LICENSE.txt" "$out/licenses/uc.micro.txt"

if $check; then
    if ! diff -r "$out" "$here/vendor" >/dev/null; then
        diff -rq "$out" "$here/vendor" >&2 || true
        echo "server/webui/vendor/ differs from package-lock.json's packages: run server/webui/vendor.sh" >&2
        exit 1
    fi
    echo "server/webui/vendor/ matches package-lock.json"
else
    rm -rf "$here/vendor"
    cp -r "$out" "$here/vendor"
    echo "server/webui/vendor/ refreshed from package-lock.json"
fi
