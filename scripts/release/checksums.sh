#!/usr/bin/env bash
# Writes DIR/checksums.txt: the sha256 of every archive in DIR, one
# "<hex>  <name>" line each, sorted by name, the format `sha256sum -c`
# reads and the action's install script checks downloads against.
set -euo pipefail
dir="${1:?usage: checksums.sh DIR}"
cd "$dir"
shopt -s nullglob
archives=(*.tar.gz)
if [ "${#archives[@]}" -eq 0 ]; then
	echo "checksums.sh: no .tar.gz archives in $dir" >&2
	exit 1
fi
sha256sum "${archives[@]}" | LC_ALL=C sort -k2 >checksums.txt.tmp
mv checksums.txt.tmp checksums.txt
