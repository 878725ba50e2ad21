#!/usr/bin/env bash
# fetch_npm_package.sh NAME@VERSION DEST_DIR: unpacks an npm package (via `npm pack`, the
# registry's own client) into DEST_DIR. Does nothing when DEST_DIR/.fetched names the same
# package, so it is safe to call on every run.
set -euo pipefail

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
if [ $# -ne 2 ]; then
  echo "usage: $0 NAME@VERSION DEST_DIR" >&2
  exit 2
fi
spec="$1"
dest="$2"

if [ -f "$dest/.fetched" ] && [ "$(cat "$dest/.fetched")" = "$spec" ]; then
  exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "fetch_npm_package: npm not found (run scripts/setup.sh)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
( cd "$work" && npm pack --silent "$spec" >/dev/null 2>"$work/npm.log" ) || {
  echo "fetch_npm_package: 'npm pack $spec' failed:" >&2
  cat "$work/npm.log" >&2
  exit 1
}
tarball="$(ls "$work"/*.tgz)"
mkdir -p "$work/unpacked"
tar -xzf "$tarball" -C "$work/unpacked"
# npm tarballs hold one top folder, "package/"; install it whole, then mark it complete.
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.partial"
mv "$work/unpacked/package" "$dest.partial"
echo "$spec" >"$dest.partial/.fetched"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "fetch_npm_package: $spec -> $dest"
