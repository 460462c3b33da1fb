#!/usr/bin/env bash
# Checks that TAG is a release the Action can be used at, and moves its
# major tag (v1 for v1.4.2) to TAG's commit, so `uses: gpupass/gpupass@v1`
# gets the newest v1 release. A pre-release (v1.5.0-rc.1) moves nothing.
#   major-tag.sh check TAG   only the checks (before anything is published)
#   major-tag.sh move TAG    checks, then moves the tag; PUSH=1 pushes it
#                            to origin (the release workflow; a dry run
#                            leaves it local)
set -euo pipefail
mode="${1:-}" tag="${2:-}"
if [[ ! "$mode" =~ ^(check|move)$ ]] || [ -z "$tag" ]; then
	echo "usage: major-tag.sh check|move TAG" >&2
	exit 2
fi
if ! [[ "$tag" =~ ^v([0-9]+)\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "major-tag.sh: tag \"$tag\" is not vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2
	exit 1
fi
major="v${BASH_REMATCH[1]}" pre="${BASH_REMATCH[2]}"
stamped="$(git show "$tag:scripts/action/version" 2>/dev/null | tr -d ' \t\r\n' || true)"
if [ "$stamped" != "$tag" ]; then
	echo "major-tag.sh: scripts/action/version at $tag says \"${stamped}\", not $tag: the Action would not install its own release. Tag with scripts/release/stamp.sh $tag" >&2
	exit 1
fi
[ "$mode" = move ] || exit 0
if [ -n "$pre" ]; then
	echo "major-tag.sh: $tag is a pre-release; $major stays where it is" >&2
	exit 0
fi
commit="$(git rev-parse "$tag^{commit}")"
git tag -f "$major" "$commit" >/dev/null
echo "major-tag.sh: $major -> $tag ($commit)" >&2
if [ "${PUSH:-0}" = 1 ]; then
	git push -f origin "refs/tags/$major"
fi
