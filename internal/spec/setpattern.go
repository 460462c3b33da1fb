package spec

import (
	"bytes"
	"fmt"

	"gopkg.in/yaml.v3"
)

// SetMetricPattern returns the spec YAML data with metrics.pattern set to
// pattern (added, or replacing the one written), for `gpupass train
// --metric-pattern`: the run's spec then carries the pattern to the agent
// and into the run's evidence like one written in the file. Comments and
// the rest of the document are kept; the fingerprint does not change
// (metrics is not part of it).
func SetMetricPattern(data []byte, pattern string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("setting metrics.pattern: %w", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("setting metrics.pattern: the spec is not a mapping")
	}
	value := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: pattern, Style: yaml.SingleQuotedStyle}
	metrics := child(doc.Content[0], "metrics")
	if metrics == nil || metrics.Kind != yaml.MappingNode {
		m := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{{Kind: yaml.ScalarNode, Tag: "!!str", Value: "pattern"}, value}}
		if metrics != nil {
			*metrics = *m // metrics: (null) or a scalar: replaced
		} else {
			doc.Content[0].Content = append(doc.Content[0].Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "metrics"}, m)
		}
	} else if p := child(metrics, "pattern"); p != nil {
		*p = *value
	} else {
		metrics.Content = append(metrics.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "pattern"}, value)
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("setting metrics.pattern: %w", err)
	}
	return b.Bytes(), enc.Close()
}

// child is the value of key in mapping m, nil when m has none.
func child(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}
