#!/usr/bin/env bash
# Assembles the GitLab CI/CD catalog project (gpupass/gpupass-components)
# from components/gitlab/ into OUT and commits it with the tag VERSION:
#
#   scripts/release/gitlab-catalog.sh OUT VERSION IMAGE
#   e.g. out v1.2.3 ghcr.io/gpupass/gpupass:1.2.3@sha256:<digest>
#
# The catalog takes semantic versions without a v, so v1.2.3 becomes the tag
# 1.2.3. IMAGE is the CLI image of the same release, by digest; it replaces
# the placeholder default of every template's `image` input (and the README),
# so the components run the CLI of their own release and nothing else. OUT
# may be a clone of the GitLab project: everything but .git is replaced, and
# the release is one commit on top of its history (a mirror, never a
# rewrite). The release workflow then pushes HEAD and the tag.
set -euo pipefail
usage="usage: gitlab-catalog.sh OUT VERSION IMAGE (e.g. out v1.2.3 ghcr.io/gpupass/gpupass:1.2.3@sha256:<digest>)"
out="${1:?$usage}"
raw_version="${2:?$usage}"
image="${3:?$usage}"
version="${raw_version#v}"
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
	echo "gitlab-catalog.sh: version $raw_version: the catalog takes a release version X.Y.Z (or vX.Y.Z), nothing else" >&2
	exit 1
fi
if ! [[ "$image" =~ ^[a-z0-9][^[:space:]@]*@sha256:[0-9a-f]{64}$ ]]; then
	echo "gitlab-catalog.sh: image $image: want the pushed CLI image by digest, REPOSITORY[:TAG]@sha256:<64 hex>" >&2
	exit 1
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
src=components/gitlab
placeholder='ghcr.io/gpupass/gpupass:0.0.0-dev'

mkdir -p "$out"
if [ -d "$out/.git" ] && git -C "$out" rev-parse -q --verify "refs/tags/$version" >/dev/null; then
	echo "gitlab-catalog.sh: tag $version exists in $out: a released version never moves" >&2
	exit 1
fi
find "$out" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
# The tracked files only: nothing a local run left behind (.gitlab-ci-local).
n=0
while IFS= read -r -d '' f; do
	[ -e "$root/$f" ] || continue # deleted in the work tree, still in the index
	rel="${f#"$src"/}"
	mkdir -p "$out/$(dirname "$rel")"
	cp -p "$root/$f" "$out/$rel"
	n=$((n + 1))
done < <(git -C "$root" ls-files -z -- "$src")
for f in README.md LICENSE .gitlab-ci.yml; do
	if [ ! -f "$out/$f" ]; then
		echo "gitlab-catalog.sh: $src/$f is missing: the catalog project needs it at its root" >&2
		exit 1
	fi
done

shopt -s nullglob
templates=("$out"/templates/*/template.yml)
if [ "${#templates[@]}" -eq 0 ]; then
	echo "gitlab-catalog.sh: no templates/<name>/template.yml under $src" >&2
	exit 1
fi
for t in "${templates[@]}"; do
	c="$(grep -cF "default: $placeholder" "$t" || true)"
	if [ "$c" != 1 ]; then
		echo "gitlab-catalog.sh: ${t#"$out"/}: want one image input with the default $placeholder to stamp, found $c" >&2
		exit 1
	fi
done
# sed's replacement must not read the image's characters as its own.
esc="$(printf '%s' "$image" | sed 's/[&|\\]/\\&/g')"
sed -i "s|$placeholder|$esc|g" "${templates[@]}" "$out/README.md"
if grep -rqF "$placeholder" "$out" --exclude-dir=.git; then
	echo "gitlab-catalog.sh: $placeholder is left in $(grep -rlF "$placeholder" "$out" --exclude-dir=.git | head -1)" >&2
	exit 1
fi

cd "$out"
[ -d .git ] || git init -q -b main
git add -A
git -c user.name="${GIT_AUTHOR_NAME:-gpupass release}" -c user.email="${GIT_AUTHOR_EMAIL:-release@gpupass.invalid}" \
	commit -q --allow-empty -m "gpupass components $version" -m "CLI image $image"
git tag "$version"
echo "gitlab-catalog.sh: $out: $n files, ${#templates[@]} components, tag $version at $(git rev-parse --short HEAD)" >&2
