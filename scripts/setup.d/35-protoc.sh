# protoc and the pinned Go generators for `make generate` (internal/api).
need_apt protobuf-compiler
need_go_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
need_go_tool protoc-gen-connect-go connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
