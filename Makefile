# gpupass build, test and benchmark entry points. See README.md.
SHELL := /bin/bash
GO ?= go
GOBIN_DIR := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN_DIR):/usr/lib/postgresql/15/bin:$(PATH)
export CGO_CFLAGS := -Wno-deprecated-declarations
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/gpupass/gpupass/internal/buildinfo.Version=$(VERSION)
BIN := bin
# Bumped by slower suites; `go test` kills a package past this.
TEST_TIMEOUT ?= 30m

.PHONY: all build agent-node test test-short bench lint deps demo-deps generate docs screenshots demo clean

all: build

# Every binary of cmd/ but gpupass-docs, the generator `make docs` runs:
# it links every command tree (the largest binary here) and is not shipped.
CMDS := $(filter-out ./cmd/gpupass-docs,$(patsubst %/main.go,%,$(wildcard ./cmd/*/main.go)))

## build: the binaries of cmd/ into ./bin (gpupass, gpupass-broker, gpupass-agent, gpupass-loadgen)
build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ $(CMDS)

## agent-node: bin/gpupass-node/gpupass-agent, the agent for a GPU node: -tags nokube leaves out the
## Kubernetes executor and client-go (14 MiB instead of 32; the release's gpupass-agent is built so)
agent-node:
	@mkdir -p $(BIN)/gpupass-node
	$(GO) build -trimpath -tags nokube -ldflags '$(LDFLAGS)' -o $(BIN)/gpupass-node/gpupass-agent ./cmd/gpupass-agent

## deps: install what the tests need (apt packages, pinned Go tools)
deps:
	@scripts/setup.sh

## test: every package with the race detector, end-to-end tests included
test: deps
	$(GO) vet ./...
	$(GO) test -race -tags e2e -count=1 -timeout $(TEST_TIMEOUT) ./...

## test-short: unit tests only, no e2e tag
test-short:
	$(GO) test -race -count=1 ./...

## bench: the figures named in the issues, as a table
bench: deps
	@scripts/bench.sh

## lint: gofmt, go vet, staticcheck, and bash -n of every shell script
# (a quote in an awk program inside a script's single quotes ends them:
# only running the script, or bash -n, finds it)
lint: deps
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@for f in $$(git ls-files '*.sh') .ci/run; do bash -n "$$f" || { echo "bash -n $$f failed"; exit 1; }; done
	$(GO) vet -tags e2e ./...
	staticcheck -tags e2e ./...

## generate: regenerate committed generated code with pinned tools
generate:
	@scripts/generate.sh

## docs: regenerate the CLI reference in docs/cli from the command trees (a test fails when it is stale)
docs:
	$(GO) run -trimpath ./cmd/gpupass-docs docs/cli

## screenshots: retake docs/img/*.png in headless Chromium (the dashboard's pages, the compare charts, the PR comment)
# CI=true: a missing Chromium or mermaid fails rather than skips, which
# would leave the old images in place.
screenshots:
	CI=true GPUPASS_UPDATE_SCREENSHOTS=1 $(GO) test -tags e2e -count=1 -timeout $(TEST_TIMEOUT) \
		-run '^(TestDashboardBrowser|TestCompareRenderedInChromium)$$' ./broker/ui/ ./internal/report/

## demo-deps: install only what the demo needs (Debian python3, python3-torch, python3-numpy)
demo-deps:
	@scripts/setup.sh demo

## demo: the main job on this machine (installs what it needs first)
demo: demo-deps build
	@scripts/demo.sh

clean:
	rm -rf $(BIN)
