#!/usr/bin/env bash
# make generate: regenerate the committed protobuf + ConnectRPC code from
# internal/api/proto with the pinned generators (scripts/setup.d/35-protoc.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
for f in scripts/setup.d/35-protoc.sh; do . "$f"; done
out=internal/api/gen
rm -rf "$out"
mkdir -p "$out"
protoc -I internal/api/proto \
	--plugin=protoc-gen-go="$GOBIN_DIR/protoc-gen-go" \
	--plugin=protoc-gen-connect-go="$GOBIN_DIR/protoc-gen-connect-go" \
	--go_out="$out" --go_opt=paths=source_relative \
	--connect-go_out="$out" --connect-go_opt=paths=source_relative \
	$(cd internal/api/proto && find . -name '*.proto' | sort | sed 's|^\./||')
gofmt -l "$out" | xargs -r gofmt -w
