package gpupass

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A broker found through up's config.json (no --broker-url) is named in
// train's errors: they said "submitting the run in us-west-2 at : …",
// as the URL was read before the broker was found.
func TestTrainErrorNamesTheBrokerFoundLocally(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // nothing answers there now
	state, proj := t.TempDir(), t.TempDir()
	if _, err := writeLocalConfig(state, &LocalConfig{BrokerURL: down, Token: "gpp_x"}); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(proj, "gpupass.yaml")
	if err := os.WriteFile(spec, []byte("name: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	getenv := func(k string) string {
		if k == "GPUPASS_STATE_DIR" {
			return state
		}
		return ""
	}
	o := &TrainOptions{Broker: BrokerFlags{getenv: getenv}}
	o.Spec, o.Regions, o.Command, o.NoWorkdir, o.Getenv = spec, []string{"us-west-2"}, []string{"true"}, true, getenv
	err = RunTrain(context.Background(), o, io.Discard, io.Discard)
	if want := "submitting the run in us-west-2 at " + down; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("train with up's broker down: %v\nwant an error naming %q", err, want)
	}
}
