#!/usr/bin/env bash
# Installs what the tests and the demo need on a Debian machine: every
# scripts/setup.d/*.sh in order. Idempotent; quick when all is present.
# Without root it prints the exact apt-get command and fails.
#
# `scripts/setup.sh demo` (what `make demo` runs) installs only what the
# demo needs: Debian's python3, python3-torch and python3-numpy, and
# nothing of the test toolchain (PostgreSQL, registry, cosign, npm tools):
# the demo signs and verifies its audit with gpupass, without the cosign
# CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
case "${1:-}" in
demo)
	need_demo_python
	exit
	;;
"") ;;
*)
	echo "setup: unknown argument ${1}; usage: scripts/setup.sh [demo]" >&2
	exit 2
	;;
esac
for f in scripts/setup.d/*.sh; do
	# shellcheck disable=SC1090
	. "$f"
done
