// Package promutil holds what the broker's and the agent's Prometheus
// instrumentation share.
package promutil

import (
	"regexp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// fqName finds a family's name in a Desc's String(), the only place
// client_golang shows it.
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// Names lists the family names cs describe, sorted, each once.
func Names(cs ...prometheus.Collector) []string {
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range cs {
			c.Describe(ch)
		}
		close(ch)
	}()
	var out []string
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			out = append(out, m[1])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
