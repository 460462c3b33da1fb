package report

import (
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
)

type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Error     *junitMessage `xml:"error,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

// JUnit writes one test case per pair and tolerance check, so GitHub and
// GitLab test report views list each comparison.
func JUnit(w io.Writer, r *Report) error {
	suite := junitSuite{Name: "gpupass compare " + r.Metric}
	for _, p := range r.Pairs {
		class := "gpupass.compare." + junitName(p.A) + "_vs_" + junitName(p.B)
		if p.Error != "" {
			suite.Cases = append(suite.Cases, junitCase{
				Name: "common steps", Classname: class, Time: "0",
				Error: &junitMessage{Message: p.Error, Type: "NoOverlap", Text: p.Error},
			})
			suite.Errors++
			continue
		}
		if len(p.Disputed) > 0 {
			msg := "log disputed (" + strings.Join(p.Disputed, ", ") + "): records were sent twice with different content; the figures are not proof"
			suite.Cases = append(suite.Cases, junitCase{
				Name: "undisputed logs", Classname: class, Time: "0",
				Error: &junitMessage{Message: msg, Type: "LogDisputed", Text: msg},
			})
			suite.Errors++
		}
		for _, c := range p.Checks {
			name := "max |Δ" + r.Metric + "| ≤ " + Num(c.Limit)
			if c.Kind == "rel" {
				name = "max |Δ" + r.Metric + "|/|" + p.A + "| ≤ " + pct(c.Limit)
			}
			tc := junitCase{Name: name, Classname: class, Time: "0"}
			if !c.Passed {
				msg := fmt.Sprintf("%d of %d common steps past %s; first at step %d; worst %s at step %d",
					c.Failures, p.CommonSteps, c.LimitText(), *c.FirstFail, c.WorstText(), c.WorstStep)
				tc.Failure = &junitMessage{Message: msg, Type: "Divergence", Text: msg}
				suite.Failures++
			}
			suite.Cases = append(suite.Cases, tc)
		}
	}
	suite.Tests = len(suite.Cases)
	doc := junitSuites{Name: "gpupass compare", Tests: suite.Tests, Failures: suite.Failures, Errors: suite.Errors, Suites: []junitSuite{suite}}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("encoding junit: %w", err)
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func junitName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '.' || r == ' ' {
			return '_'
		}
		return r
	}, strconv.Quote(s)[1:len(strconv.Quote(s))-1])
}
