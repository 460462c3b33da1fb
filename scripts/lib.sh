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

# The Debian packages of the local Kubernetes cluster (scripts/k8s-up.sh,
# which installs them as root as setup.d/70-kubernetes.sh does): etcd,
# containerd, runc, the CNI plugins, iptables and conntrack, busybox-static
# for the sandbox image, openssl for its certificates, curl and iproute2
# (neither is in a minimal Debian).
K8S_APT_PACKAGES=(etcd-server containerd runc containernetworking-plugins iptables conntrack busybox-static openssl curl iproute2)

# The Debian packages that give /usr/bin/python3 what `make demo`'s job
# imports (examples/train/train.py); internal/command/gpupass.DemoAptPackages is the
# same list, which `gpupass up --demo` names when they are missing.
DEMO_APT_PACKAGES=(python3 python3-torch python3-numpy)

# need_demo_python: make the demo's interpreter ($GPUPASS_PYTHON, the
# --python of `gpupass up`; default /usr/bin/python3) able to import torch
# and numpy, by installing DEMO_APT_PACKAGES where it cannot. It asks the
# interpreter itself, not only dpkg: what the demo fails on is the import.
# Quick when the import works; without root, need_apt prints the exact
# apt-get line and this fails.
need_demo_python() {
	local py="${GPUPASS_PYTHON:-/usr/bin/python3}"
	_demo_imports "$py" && return 0
	echo "setup: $py cannot import torch and numpy (the demo's job needs them)" >&2
	need_apt "${DEMO_APT_PACKAGES[@]}" || return 1
	_demo_imports "$py" && return 0
	echo "setup: $py still cannot import torch and numpy with ${DEMO_APT_PACKAGES[*]} installed:" \
		"Debian's packages serve /usr/bin/python3 only; unset GPUPASS_PYTHON, or install torch and numpy into $py" >&2
	return 1
}

# _demo_imports PY: PY starts and imports what the demo's job imports,
# isolated (-I) as the agent starts it, so no PYTHONPATH can make it pass.
_demo_imports() {
	[ -x "$1" ] && "$1" -I -B -c 'import torch, numpy' >/dev/null 2>&1
}
