package kubernetes

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node is one GPU node as the Kubernetes API describes it.
type Node struct {
	Name string `json:"name"`
	// GPUs is the node's allocatable nvidia.com/gpu (else GFD's
	// nvidia.com/gpu.count label).
	GPUs    int    `json:"gpus"`
	Product string `json:"gpu_product,omitempty"`
	// Cordoned is spec.unschedulable (kubectl cordon, drain).
	Cordoned bool `json:"cordoned,omitempty"`
	// NotReady is why the Ready condition is not True (empty when it is).
	NotReady string `json:"not_ready,omitempty"`
	// Pressure lists the pressure conditions that are True.
	Pressure []string `json:"pressure,omitempty"`
	// Taints are the NoSchedule and NoExecute taints a run's pod does
	// not tolerate ("key=value:Effect").
	Taints []string `json:"taints,omitempty"`
}

// Unavailable says why the node is not certified (a run placed there
// would not start, or an admin asked for no new work there); empty when
// it is usable.
func (n Node) Unavailable() string {
	var why []string
	if n.Cordoned {
		why = append(why, "cordoned")
	}
	if n.NotReady != "" {
		why = append(why, "not ready: "+n.NotReady)
	}
	for _, p := range n.Pressure {
		why = append(why, "under "+p)
	}
	if len(n.Taints) > 0 {
		why = append(why, "tainted "+strings.Join(n.Taints, ", "))
	}
	if n.GPUs == 0 {
		why = append(why, "no allocatable "+string(GPUResource))
	}
	if len(why) == 0 {
		return ""
	}
	return "kubernetes node " + n.Name + " is " + strings.Join(why, "; ")
}

// tolerated are the taints a run's pod tolerates (podSpec).
func tolerated(t corev1.Taint) bool {
	return t.Key == string(GPUResource) && t.Effect == corev1.TaintEffectNoSchedule
}

// Nodes returns the cluster's GPU nodes, by name: those with allocatable
// nvidia.com/gpu or GPU Feature Discovery's count label (a GPU node
// whose device plugin stopped still shows, as unavailable). selector, when
// set, is a label selector that narrows them.
func (c *Client) Nodes(ctx context.Context, selector string) ([]Node, error) {
	cctx, cancel := c.ctx(ctx)
	defer cancel()
	list, err := c.API.CoreV1().Nodes().List(cctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("listing kubernetes nodes: %w", err)
	}
	var out []Node
	for i := range list.Items {
		if n, ok := NodeOf(&list.Items[i]); ok {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// NodeOf reads a GPU node; false when the node has no GPUs at all.
func NodeOf(k *corev1.Node) (Node, bool) {
	n := Node{Name: k.Name, Product: k.Labels[LabelGPUProduct], Cordoned: k.Spec.Unschedulable}
	q, has := k.Status.Allocatable[GPUResource]
	if has {
		n.GPUs = int(q.Value())
	}
	labelled, _ := strconv.Atoi(k.Labels[LabelGPUCount])
	if !has && labelled == 0 {
		return n, false
	}
	n.NotReady = "no Ready condition"
	for _, cond := range k.Status.Conditions {
		switch cond.Type {
		case corev1.NodeReady:
			n.NotReady = ""
			if cond.Status != corev1.ConditionTrue {
				n.NotReady = "Ready=" + string(cond.Status)
				if cond.Reason != "" {
					n.NotReady += " (" + cond.Reason + ")"
				}
			}
		case corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure:
			if cond.Status == corev1.ConditionTrue {
				n.Pressure = append(n.Pressure, string(cond.Type))
			}
		}
	}
	for _, t := range k.Spec.Taints {
		if t.Effect == corev1.TaintEffectPreferNoSchedule || tolerated(t) {
			continue
		}
		if t.Key == corev1.TaintNodeUnschedulable && n.Cordoned {
			continue // said once, as cordoned
		}
		s := t.Key
		if t.Value != "" {
			s += "=" + t.Value
		}
		n.Taints = append(n.Taints, s+":"+string(t.Effect))
	}
	return n, true
}
