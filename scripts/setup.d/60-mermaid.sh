# Mermaid render test (internal/report, issue #36): the PR comment's
# markdown rendered in headless Chromium as GitHub shows it, with the
# mermaid version GitHub renders (its `info` diagram says 11.17.2) and
# marked for the markdown around the chart. Both are npm packages, loaded
# as files into a local page (no puppeteer, which would download its own
# Chrome); they live in the npm tools dir of 50-ci-runners.sh
# (internal/testutil.ToolsDir). The version check reinstalls on a bump.
# The colour dots of the chart's legend line are emoji: without a colour
# emoji font Chromium draws boxes in the screenshots (make screenshots).
need_apt fonts-noto-color-emoji
MERMAID_VERSION=11.17.2
MARKED_VERSION=16.4.2
GPUPASS_TOOLS_DIR="${GPUPASS_TOOLS_DIR:-$HOME/.cache/gpupass-tools}"
_npm_version() { # DIR PACKAGE: the installed version, "" when none
	sed -n 's/^  "version": "\(.*\)",$/\1/p' "$1/node_modules/$2/package.json" 2>/dev/null | head -n 1
}
if [ "$(_npm_version "$GPUPASS_TOOLS_DIR" mermaid)" != "$MERMAID_VERSION" ] ||
	[ "$(_npm_version "$GPUPASS_TOOLS_DIR" marked)" != "$MARKED_VERSION" ]; then
	echo "setup: npm install mermaid@$MERMAID_VERSION marked@$MARKED_VERSION into $GPUPASS_TOOLS_DIR" >&2
	mkdir -p "$GPUPASS_TOOLS_DIR"
	npm install --silent --no-audit --no-fund --save-exact --prefix "$GPUPASS_TOOLS_DIR" "mermaid@$MERMAID_VERSION" "marked@$MARKED_VERSION" >&2
fi
