package kubernetes

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/rendezvous"
)

// A run across several nodes is one Job per rank, each created and
// followed by the agent that stands for the rank's node (the rank's own
// allocation: its own log, spool, report, cancel and grace), pinned to
// that node as every run's Job is. An Indexed Job would have one pod
// template for every index: it cannot pin index i to rank i's node,
// mount only rank i's work dir, or give rank i its environment, and one
// agent would own the pods of ranks other agents answer for.
//
// The cluster may have no DNS (no Service resolves), so the rendezvous
// is rank 0's pod IP: rank 0's pod reads its own from the downward API
// (status.podIP); the agent of each other rank waits for rank 0's pod
// to have an IP, then creates its rank's Job with that IP in its
// environment. Ranks end together through the broker: a rank that
// fails fails the run, and the broker has the others' agents delete
// their Jobs.

// Labels on the Jobs and pods of a gang's ranks.
const (
	// LabelGang is rank 0's allocation id (the run), on every rank.
	LabelGang = "gpupass.dev/gang"
	// LabelRank is the rank.
	LabelRank = "gpupass.dev/rank"
	// LabelRendezvous is the gang attempt's MASTER_PORT, which the
	// broker draws afresh for each attempt: a restarted gang's rank
	// looks for the pod of this attempt's rank 0, not the one the
	// attempt before left (ended, or not yet deleted).
	LabelRendezvous = "gpupass.dev/rendezvous-port"
)

// RankZeroWait bounds how long a rank waits for rank 0's pod to have an
// IP: its image pulled and a sandbox made.
const RankZeroWait = 10 * time.Minute

// gangRank is an attempt's place in a gang, read from its rendezvous
// environment (rendezvous.Gang.Rank, as the agent's run loop gives it);
// ok is false for a run on one node.
type gangRank struct {
	rank, nodes int
	// run is rank 0's allocation id: rank r's is RUN-rR (the broker's
	// naming, broker/gang.go).
	run string
	// port is the attempt's MASTER_PORT, as given.
	port string
}

func gangOf(env []string, alloc string) (gangRank, bool, error) {
	n := executor.EnvValue(env, "GPUPASS_NNODES")
	if n == "" {
		return gangRank{}, false, nil
	}
	nodes, err1 := strconv.Atoi(n)
	rank, err2 := strconv.Atoi(executor.EnvValue(env, "GPUPASS_NODE_RANK"))
	if err1 != nil || err2 != nil || nodes < 1 || rank < 0 || rank >= nodes {
		return gangRank{}, false, fmt.Errorf("the rendezvous environment has node rank %q of %q nodes", executor.EnvValue(env, "GPUPASS_NODE_RANK"), n)
	}
	g := gangRank{rank: rank, nodes: nodes, run: alloc, port: executor.EnvValue(env, "GPUPASS_MASTER_PORT")}
	if rank > 0 {
		suffix := "-r" + strconv.Itoa(rank)
		if !strings.HasSuffix(alloc, suffix) {
			return gangRank{}, false, fmt.Errorf("rank %d's allocation id %q does not end in %s", rank, alloc, suffix)
		}
		g.run = strings.TrimSuffix(alloc, suffix)
	}
	return g, true, nil
}

// masterVars are the rendezvous variables that carry rank 0's address.
var masterVars = map[string]bool{"MASTER_ADDR": true, "PET_MASTER_ADDR": true, "GPUPASS_MASTER_ADDR": true}

// withMaster is env with rank 0's address in masterVars: ip, or, for
// rank 0 itself (ip ""), its own pod's IP from the downward API.
func withMaster(env []corev1.EnvVar, ip string) []corev1.EnvVar {
	for i := range env {
		if !masterVars[env[i].Name] {
			continue
		}
		if ip != "" {
			env[i].Value = ip
			continue
		}
		env[i].Value = ""
		env[i].ValueFrom = &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}
	}
	return env
}

// rankZeroIP waits for the pod of the gang attempt's rank 0 (the run's,
// with the attempt's rendezvous port) to have an IP and returns it. A
// rank 0 that ended (or a wait longer than RankZeroWait) is an error:
// this rank would wait for a rendezvous nobody hosts.
func (c *Client) rankZeroIP(ctx context.Context, g gangRank, note func(string, map[string]string)) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, RankZeroWait)
	defer cancel()
	run := g.run
	sel := LabelManagedBy + "=" + managedBy + "," + LabelKind + "=run," + LabelAlloc + "=" + labelValue(run) + "," + LabelRendezvous + "=" + labelValue(g.port)
	t := time.NewTicker(c.poll())
	defer t.Stop()
	noted := false
	for {
		cctx, ccancel := c.ctx(ctx)
		pods, err := c.API.CoreV1().Pods(c.Namespace).List(cctx, metav1.ListOptions{LabelSelector: sel})
		ccancel()
		if err == nil {
			ip, ended := "", ""
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.Annotations[AnnotationAlloc] != run {
					continue // a label hash's namesake
				}
				switch {
				case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.DeletionTimestamp != nil:
					ended = p.Name
				case p.Status.PodIP != "":
					if a, perr := netip.ParseAddr(p.Status.PodIP); perr == nil && rendezvous.CheckAddr(a.String()) == nil {
						ip = a.String()
						if note != nil {
							note("rank 0's pod "+p.Name+" has IP "+ip+": the rendezvous (MASTER_ADDR)", map[string]string{"kube_pod": p.Name, "master_addr": ip})
						}
					}
				}
			}
			if ip != "" {
				return ip, nil
			}
			if ended != "" {
				return "", fmt.Errorf("rank 0's pod %s ended before this rank started", ended)
			}
		}
		if !noted && note != nil {
			noted = true
			note("waiting for rank 0's pod (run "+run+") to have an IP: the rendezvous (MASTER_ADDR)", nil)
		}
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return "", fmt.Errorf("rank 0's pod (run %s) had no IP after %s", run, RankZeroWait)
			}
			return "", ctx.Err()
		case <-t.C:
		}
	}
}
