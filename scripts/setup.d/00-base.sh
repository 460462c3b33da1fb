# Base tools: lint.
need_go_tool staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2
# systemd-analyze: deploy/'s tests verify the systemd units with it.
need_apt systemd
