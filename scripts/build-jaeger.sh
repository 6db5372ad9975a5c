#!/usr/bin/env bash
# Build Jaeger v2's binary (cmd/jaeger) from the Go module proxy, once, and print its path.
#
# Jaeger's v2.x tags are not valid Go module versions (the module path has no /v2), and `go
# install` refuses the v1.x tags because their go.mod has replace directives. Depending on the
# module from a throw-away module (`go get -tool`) sidesteps both: v1.76.0 is the tag of the
# same release commit as v2.13.0, and cmd/jaeger there is the v2 (OpenTelemetry-collector) binary.
set -euo pipefail
JAEGER_MODULE_VERSION=${JAEGER_MODULE_VERSION:-v1.76.0}
cache=${XSP_CACHE:-$HOME/.cache/xsp}/jaeger-$JAEGER_MODULE_VERSION
bin=$cache/jaeger
if [ ! -x "$bin" ]; then
  command -v go >/dev/null || { echo "build-jaeger: Go is needed (1.26 or newer)" >&2; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "build-jaeger: building Jaeger ($JAEGER_MODULE_VERSION) into $cache (several minutes the first time)" >&2
  (cd "$work" && go mod init xsp-jaeger-build >/dev/null 2>&1 \
     && go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_MODULE_VERSION" \
     && mkdir -p "$cache" && go build -o "$bin.tmp" github.com/jaegertracing/jaeger/cmd/jaeger) >&2
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
