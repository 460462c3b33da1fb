package match

import "strconv"

// GangPick is where a run across k nodes can go in one region now.
type GangPick struct {
	// Nodes are k candidates (best first) that share an accelerator and
	// a runtime, each matching the spec's share of the GPUs and free to
	// take it now; nil when there are not k such.
	Nodes []*Result
	// Busy, when Nodes is nil, are the nodes that would make up a gang
	// but are not free now: the run waits for them.
	Busy []string
	// Miss, when Nodes and Busy are both empty, says why the region has
	// no gang at all (gangMiss, as a dry-run says it).
	Miss string
}

// PlaceGang picks a gang of k nodes in q's one region (q.Regions[0]) for
// q.Spec: candidates of its share of the GPUs (PerNode) that advertise a
// rendezvous address (a node whose jobs the others cannot reach takes no
// rank), grouped by accelerator, runtime and site (a Slurm cluster's
// nodes only with each other: gangKeyOf), best first. skip leaves a
// node out altogether (lost on before), free says whether a node may
// take the run now (not busy, not claimed by a run ahead in the queue).
// The first group with k free nodes is the gang; failing that, a group
// with k nodes counting the busy ones makes the run wait for them.
func (ix *Index) PlaceGang(q Query, k int, skip, free func(id string) bool) GangPick {
	per := PerNode(q.Spec, k)
	pq := q
	pq.Spec = per
	vs := ix.Match(pq)
	defer vs.Release()
	var out GangPick
	all := map[gangKey][]int32{}
	idle := map[gangKey][]Verdict{}
	anyRdv := map[gangKey]int{}  // with the nodes that advertise no rendezvous
	anySite := map[gangKey]int{} // rendezvous, of any site
	var waitKey *gangKey
	reachable, candidates := 0, 0
	for i := range vs.Candidates {
		v := vs.Candidates[i]
		n := &ix.nodes[v.Node]
		if skip(n.ID) {
			continue
		}
		key := ix.gangKeyOf(v.Node)
		anyRdv[key]++
		candidates++
		if !n.Labels.Rendezvous() {
			continue
		}
		reachable++
		anySite[gangKey{key.region, key.runtime, key.accel, -1}]++
		all[key] = append(all[key], v.Node)
		if free(n.ID) {
			idle[key] = append(idle[key], v)
			if len(idle[key]) == k {
				out.Nodes = vs.results(idle[key])
				return out
			}
		}
		if len(all[key]) == k && waitKey == nil {
			waitKey = &key
		}
	}
	if waitKey != nil {
		for _, n := range all[*waitKey] {
			if id := ix.nodes[n].ID; !free(id) {
				out.Busy = append(out.Busy, id)
			}
		}
		return out
	}
	for _, c := range anyRdv {
		if c >= k {
			// Enough nodes match, but not enough of them can be reached.
			only := "only " + strconv.Itoa(reachable)
			if reachable == 0 {
				only = "none"
			}
			out.Miss = count(candidates, "candidate nodes") + " for " + count(per.Resources.Count, "GPUs") + " each, but " + only +
				" advertise a job address and ports for the gang's rendezvous (a gang needs " + strconv.Itoa(k) +
				"; start the local executor's agents with --job-address and --job-ports, a Slurm or Kubernetes agent with --job-ports)"
			return out
		}
	}
	for key, c := range anySite {
		if c >= k {
			most := 0
			for kk, nodes := range all {
				if kk.region == key.region && kk.runtime == key.runtime && kk.accel == key.accel {
					most = max(most, len(nodes))
				}
			}
			out.Miss = count(c, "candidate nodes") + " for " + count(per.Resources.Count, "GPUs") + " each advertise a rendezvous, but at most " +
				strconv.Itoa(most) + " can join one gang (a gang needs " + strconv.Itoa(k) + "; a Slurm cluster's nodes run a gang as one batch job there, and a Kubernetes cluster's pods reach each other only within it)"
			return out
		}
	}
	region := int32(-1)
	for _, r := range ix.regions {
		if len(q.Regions) > 0 && ix.names[r] == q.Regions[0] {
			region = r
		}
	}
	_, out.Miss = ix.gangMiss(&vs, region, k, per, q.MinScore, q.MaxPrice)
	return out
}
