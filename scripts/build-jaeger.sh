#!/usr/bin/env bash
# Build Jaeger v2 (cmd/jaeger) from the Go module proxy and its web UI from source, once each, and
# print the binary's path. The UI lands beside it, in ui/ (serve it with JAEGER_UI_ASSETS=<that>).
#
# Jaeger's v2.x tags are not valid Go module versions (the module path has no /v2), and `go
# install` refuses the v1.x tags because their go.mod has replace directives. Depending on the
# module from a throw-away module (`go get -tool`) sidesteps both: v1.76.0 is the tag of the
# same release commit as v2.13.0, and cmd/jaeger there is the v2 (OpenTelemetry-collector) binary.
#
# The binary built from the Go module embeds only a placeholder page, not the UI. The UI of the
# same release (jaeger-ui v1.76.0) is built with npm from its source: the vendored copy in
# ../shared/vendor when this checkout has one, else the release's source archive.
set -euo pipefail
JAEGER_MODULE_VERSION=${JAEGER_MODULE_VERSION:-v1.76.0}
JAEGER_UI_VERSION=${JAEGER_UI_VERSION:-v1.76.0}
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${XSP_CACHE:-$HOME/.cache/xsp}/jaeger-$JAEGER_MODULE_VERSION
bin=$cache/jaeger
ui=$cache/ui

say() { echo "build-jaeger: $*" >&2; }

if [ ! -x "$bin" ]; then
  command -v go >/dev/null || { say "Go is needed (1.26 or newer) to build Jaeger"; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  say "building Jaeger ($JAEGER_MODULE_VERSION) into $cache (several minutes the first time)"
  (cd "$work" && go mod init xsp-jaeger-build >/dev/null 2>&1 \
     && go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_MODULE_VERSION" \
     && mkdir -p "$cache" && go build -o "$bin.tmp" github.com/jaegertracing/jaeger/cmd/jaeger) >&2
  mv "$bin.tmp" "$bin"
fi

if [ ! -f "$ui/index.html" ]; then
  command -v npm >/dev/null || { say "npm (node 20 or newer) is needed to build Jaeger's UI"; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  vendored=$root/../shared/vendor/jaeger-ui-${JAEGER_UI_VERSION#v}
  if [ -f "$vendored/package.json" ]; then
    say "building Jaeger's UI from $vendored (about 2 minutes)"
    cp -r "$vendored" "$work/src"
  else
    url=https://github.com/jaegertracing/jaeger-ui/archive/refs/tags/$JAEGER_UI_VERSION.tar.gz
    say "fetching Jaeger's UI source ($JAEGER_UI_VERSION) from $url"
    mkdir -p "$work/src"
    curl -fsSL "$url" | tar -xz -C "$work/src" --strip-components=1
  fi
  chmod -R u+w "$work/src"
  # The UI's .npmrc asks for node 24 (engine-strict); node 20 builds it just as well.
  (cd "$work/src" && npm ci --engine-strict=false --no-audit --no-fund --loglevel=error \
     && npm run build) >&2 || { say "the UI build failed (output above)"; exit 1; }
  rm -rf "$ui.tmp" && cp -r "$work/src/packages/jaeger-ui/build" "$ui.tmp"
  rm -rf "$ui" && mv "$ui.tmp" "$ui"
fi
echo "$bin"
