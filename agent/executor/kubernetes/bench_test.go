package kubernetes_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	k8s "k8s.io/client-go/kubernetes"

	"github.com/gpupass/gpupass/agent/executor"
	kube "github.com/gpupass/gpupass/agent/executor/kubernetes"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/k8stest"
)

// BenchmarkSubmitToFirstLine times submit → first output line on the
// real test cluster, through the Runner (what the agent does for a run:
// a Job pinned to the node, output read from the shared dir) and through
// kubectl (create the same kind of Job, wait for its first log line with
// kubectl logs -f), alternated in one run. Reported: p50 and p95 of each,
// in ms.
func BenchmarkSubmitToFirstLine(b *testing.B) {
	c := k8stest.Require(b)
	ns := c.Namespace(b)
	image := c.RunImage(b, "")
	cfg, _, err := kube.Config(c.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	api, err := k8s.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	shared, err := os.MkdirTemp("", "gpupass-k8s-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(shared)
	const poll = 20 * time.Millisecond
	testutil.Alternate(b, testutil.Timed{Name: "gpupass", Run: func(i int) time.Duration {
		dir := filepath.Join(shared, fmt.Sprintf("r%d", i))
		_ = os.Mkdir(dir, 0o755)
		r := &kube.Runner{Client: &kube.Client{API: api, Namespace: ns, Image: image, Poll: poll, Volume: kube.SharedDir{Path: shared}},
			Cluster: "bench", Node: c.NodeName, GPUs: 1}
		var once sync.Once
		start := time.Now()
		var first time.Duration
		r.Run(context.Background(), executor.Attempt{Dir: dir, Command: []string{"echo", "first"}, Grace: time.Second,
			Env: []string{executor.EnvAllocID + "=alloc-bench", executor.EnvAttempt + fmt.Sprint("=", i+1)}},
			func(executor.Line) { once.Do(func() { first = time.Since(start) }) })
		return first
	}}, testutil.Timed{Name: "kubectl", Run: func(i int) time.Duration {
		name := fmt.Sprintf("kubectl-bench-%d", i)
		manifest := fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: %s}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      # Pinned as the runner pins its pods: through the scheduler.
      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [%s]}]}]}}}
      containers:
      - name: run
        image: %s
        imagePullPolicy: IfNotPresent
        command: ["echo", "first"]
        resources: {limits: {nvidia.com/gpu: 1}}
`, name, c.NodeName, image)
		start := time.Now()
		c.KubectlStdin(b, manifest, "-n", ns, "create", "-f", "-")
		for {
			cmd := c.KubectlCmd(context.Background(), "-n", ns, "logs", "-f", "job/"+name)
			out, _ := cmd.StdoutPipe()
			_ = cmd.Start()
			line, _ := bufio.NewReader(out).ReadString('\n')
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if strings.TrimSpace(line) == "first" {
				break
			}
			time.Sleep(poll) // the pod is not there yet
		}
		return time.Since(start)
	}})
}
