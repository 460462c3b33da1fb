# The real cosign CLI for interop tests (verify-blob of agent reports and
# audit bundles). About 5 minutes cold; the version check makes it free after.
need_go_tool cosign github.com/sigstore/cosign/v2/cmd/cosign@v2.6.5
