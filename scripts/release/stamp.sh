#!/usr/bin/env bash
# Makes the release commit for VERSION (vMAJOR.MINOR.PATCH[-PRE]) and tags
# it: the one change is scripts/action/version, so the Action at that tag
# (and at the moving major tag the release workflow points at it) installs
# the CLI of its own release instead of `latest`. The commit is made on a
# detached HEAD; the branch it started from keeps "dev". Pushing the tag
# starts .github/workflows/release.yml.
#   scripts/release/stamp.sh v1.2.0 && git push origin v1.2.0
set -euo pipefail
version="${1:?usage: stamp.sh vMAJOR.MINOR.PATCH}"
if ! [[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "stamp.sh: version \"$version\" is not vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2
	exit 2
fi
cd "$(git rev-parse --show-toplevel)"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
	echo "stamp.sh: the work tree has uncommitted changes; commit or stash them first" >&2
	exit 1
fi
git checkout -q --detach
printf '%s\n' "$version" >scripts/action/version
git add scripts/action/version
git commit -q -m "release $version: the Action installs gpupass $version by default"
git tag -a "$version" -m "gpupass $version"
echo "tagged $version at $(git rev-parse --short HEAD); push it with: git push origin $version" >&2
