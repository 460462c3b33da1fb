#!/usr/bin/env bash
# Installs what the tests and the demo need on a Debian machine: every
# scripts/setup.d/*.sh in order. Idempotent; quick when all is present.
# Without root it prints the exact apt-get command and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
for f in scripts/setup.d/*.sh; do
	# shellcheck disable=SC1090
	. "$f"
done
