# Shared helpers for scripts/setup.d/*.sh. Sourced, not run.
# Every helper is idempotent and quick when the thing is already there.

GOBIN_DIR="$(go env GOBIN)"
[ -n "$GOBIN_DIR" ] || GOBIN_DIR="$(go env GOPATH)/bin"
export PATH="$GOBIN_DIR:/usr/lib/postgresql/15/bin:$PATH"

_apt_updated=""

# need_apt PKG...: install Debian packages that are missing. Without root,
# print the exact command to run and fail.
need_apt() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	if [ "$(id -u)" != 0 ]; then
		echo "setup: missing Debian packages: ${missing[*]}" >&2
		echo "setup: install them with: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
		return 1
	fi
	echo "setup: apt-get install ${missing[*]}" >&2
	if [ -z "$_apt_updated" ]; then
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || return 1
		_apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# need_go_tool BIN MODULE/PATH@VERSION: go install a pinned tool into
# $(go env GOPATH)/bin unless that exact version is already there (the
# Go build cache makes a re-install cheap; the version check makes it free).
need_go_tool() {
	local bin="$1" spec="$2" want have
	want="${spec##*@}"
	if [ -x "$GOBIN_DIR/$bin" ]; then
		have="$(go version -m "$GOBIN_DIR/$bin" 2>/dev/null | awk '$1=="mod"{print $3; exit}')"
		[ "$have" = "$want" ] && return 0
	fi
	echo "setup: go install $spec" >&2
	CGO_ENABLED="${CGO_ENABLED:-0}" go install "$spec" >&2
}
