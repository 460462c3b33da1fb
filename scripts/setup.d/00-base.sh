# Base tools: lint.
need_go_tool staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2
