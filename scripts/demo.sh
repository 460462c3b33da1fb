#!/usr/bin/env bash
# make demo: the main job on this machine, on embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bin/gpupass up --demo "$@"
