# CI runners on the host for the action and component end-to-end tests:
# actionlint (+ shellcheck, which it calls for run: scripts), act for GitHub
# workflows, gitlab-ci-local for GitLab pipelines. gitlab-ci-local needs
# Node 22 (Debian's is older) and rsync; both live under a cache dir whose
# bin/ the tests put on PATH (internal/ci/citest.ToolsDir).
need_apt shellcheck rsync git
need_go_tool actionlint github.com/rhysd/actionlint/cmd/actionlint@v1.7.12
need_go_tool act github.com/nektos/act@v0.2.89

GPUPASS_TOOLS_DIR="${GPUPASS_TOOLS_DIR:-$HOME/.cache/gpupass-tools}"
if [ ! -x "$GPUPASS_TOOLS_DIR/node_modules/.bin/gitlab-ci-local" ] ||
	[ ! -x "$GPUPASS_TOOLS_DIR/node_modules/.bin/node" ]; then
	echo "setup: npm install node@22 gitlab-ci-local@4.75.1 into $GPUPASS_TOOLS_DIR" >&2
	mkdir -p "$GPUPASS_TOOLS_DIR"
	npm install --silent --no-audit --no-fund --prefix "$GPUPASS_TOOLS_DIR" node@22 gitlab-ci-local@4.75.1 >&2
fi
