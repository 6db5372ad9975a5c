#!/usr/bin/env bash
# Build SeaweedFS's `weed` (its S3 gateway is what the object-store tests talk to) from the Go
# module proxy, once, and print the binary's path.
#
# SeaweedFS tags no semver module releases, so it is pinned to one pseudo-version (a commit of
# its main branch) and depended on from a throw-away module (`go get -tool`), as Jaeger is.
set -euo pipefail
SEAWEEDFS_MODULE_VERSION=${SEAWEEDFS_MODULE_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}
cache=${XSP_CACHE:-$HOME/.cache/xsp}/seaweedfs-$SEAWEEDFS_MODULE_VERSION
bin=$cache/weed

say() { echo "build-seaweedfs: $*" >&2; }

if [ ! -x "$bin" ]; then
  command -v go >/dev/null || { say "Go is needed (1.25 or newer) to build SeaweedFS"; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  say "building SeaweedFS ($SEAWEEDFS_MODULE_VERSION) into $cache (several minutes the first time)"
  (cd "$work" && go mod init xsp-seaweedfs-build >/dev/null 2>&1 \
     && go get -tool "github.com/seaweedfs/seaweedfs/weed@$SEAWEEDFS_MODULE_VERSION" \
     && mkdir -p "$cache" && go build -o "$bin.tmp" github.com/seaweedfs/seaweedfs/weed) >&2
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
