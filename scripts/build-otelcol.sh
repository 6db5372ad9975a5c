#!/usr/bin/env bash
# Build the OpenTelemetry Collector gateway (otelcol-xsp) once with the OpenTelemetry Collector
# Builder, from the Go module proxy, into ~/.cache/xsp and print the binary's path.
#
# deploy/otelcol-builder.yaml names the components, all pinned to one release; the builder itself
# is pinned to the same release here. The cache folder is named after a hash of the manifest, so
# changing the manifest builds afresh.
set -euo pipefail
OTELCOL_BUILDER_VERSION=${OTELCOL_BUILDER_VERSION:-v0.161.0}
root=$(cd "$(dirname "$0")/.." && pwd)
manifest=$root/deploy/otelcol-builder.yaml
digest=$( (echo "$OTELCOL_BUILDER_VERSION"; cat "$manifest") | sha256sum | cut -c1-12)
cache=${XSP_CACHE:-$HOME/.cache/xsp}/otelcol-$OTELCOL_BUILDER_VERSION-$digest
bin=$cache/otelcol-xsp

say() { echo "build-otelcol: $*" >&2; }

if [ ! -x "$bin" ]; then
  command -v go >/dev/null || { say "Go is needed (1.24 or newer) to build the OpenTelemetry Collector"; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  say "building the OpenTelemetry Collector ($OTELCOL_BUILDER_VERSION) into $cache (several minutes the first time)"
  started=$(date +%s)
  GOBIN=$work/bin go install "go.opentelemetry.io/collector/cmd/builder@$OTELCOL_BUILDER_VERSION" >&2
  sed "s|^dist:|dist:\n  output_path: $work/dist|" "$manifest" >"$work/manifest.yaml"
  # The builder writes its generated module and the binary into output_path.
  (cd "$work" && "$work/bin/builder" --config "$work/manifest.yaml" --ldflags="-s -w") >&2
  mkdir -p "$cache"
  mv "$work/dist/otelcol-xsp" "$bin.tmp"
  mv "$bin.tmp" "$bin"
  say "built in $(($(date +%s) - started)) s"
fi
echo "$bin"
