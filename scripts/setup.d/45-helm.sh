# Helm, for the chart's tests (deploy/helm_test.go: helm lint, helm template
# against the kustomize manifests, the chart on the real test cluster). Built
# from the Go module proxy like the other pinned tools (no release download);
# about 3 minutes cold, free after. Before 70-kubernetes.sh, which waits
# for the Kubernetes build: a cold build of helm overlaps it that way
# instead of adding its minutes after it.
need_go_tool helm helm.sh/helm/v3/cmd/helm@v3.22.0
