//go:build e2e

package modelcmd_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/model"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestModelPushVerify is the model-provenance path as a user runs it: a
// PyTorch run on `gpupass up` that ships its checkpoints
// (--resume-elsewhere), its audit report, then `gpupass model push RUN
// REF` of the run's final checkpoint to a registry with the OCI 1.1
// referrers API (go-containerregistry's) and to one without it (Debian's
// docker-registry: the sha256-<hex> tag), and on each: the verify command
// push printed, pasted into a shell, passes; stock `cosign
// verify-attestation --type <predicate>` verifies the attestation,
// `cosign tree` shows it and `oras discover` lists it. A byte of the
// checkpoint changed in docker-registry's storage directory fails `gpupass
// model verify` on the model layer while cosign still passes: cosign
// checks the manifest digest only.
func TestModelPushVerify(t *testing.T) {
	py := upstack.RequireTorch(t)
	cosign := testutil.Tool(t, "cosign")
	oras := testutil.Tool(t, "oras")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	cfg := stack.Config(t)
	rc, err := client.DialRuns(cfg.BrokerURL, client.Options{Token: cfg.Token})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gp := func(args ...string) (stdout, all string, code int) {
		t.Helper()
		cmd := stack.Command(ctx, args...)
		cmd.Env = append(cmd.Env, "COSIGN_PASSWORD=e2e-model", "GITHUB_ACTIONS=", "GITLAB_CI=")
		stdout, stderr, code := testutil.Run(t, cmd)
		return stdout, stdout + stderr, code
	}

	train := stack.Command(ctx, "train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2", "--resume-elsewhere",
		"--workdir", "examples/train", "--name", "model-e2e", "--follow", "--", py, "train.py", "--steps", "30", "--sleep", "0.1", "--checkpoint-every", "10")
	var trainOut upstack.Buffer
	train.Stdout, train.Stderr = &trainOut, &trainOut
	if err := train.Run(); err != nil {
		t.Fatalf("train: %v\n%s", err, upstack.Tail(trainOut.String(), 4000))
	}
	runs, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
	if err != nil || len(runs.Msg.Runs) != 1 {
		t.Fatalf("runs: %v %v", runs, err)
	}
	run := runs.Msg.Runs[0]

	if _, all, code := gp("audit", "keygen", "--out-prefix", filepath.Join(dir, "cosign")); code != 0 {
		t.Fatalf("keygen: exit %d\n%s", code, all)
	}
	key, pub := filepath.Join(dir, "cosign.key"), filepath.Join(dir, "cosign.pub")
	zip := filepath.Join(dir, "audit-report.zip")
	if _, all, code := gp("audit", run.Id, "--key", key, "--out", zip); code != 0 {
		t.Fatalf("audit: exit %d\n%s", code, all)
	}
	root := filepath.Join(dir, "trusted_root.json")
	if err := os.WriteFile(root, []byte(audit.MinimalTrustedRoot), 0o644); err != nil {
		t.Fatal(err)
	}
	// The checkpoint the broker holds, for the digest the predicate must name.
	st, err := rc.Run.GetCheckpoint(ctx, connect.NewRequest(&gpupassv1.GetCheckpointRequest{AllocId: run.Id}))
	if err != nil || !st.Receive() {
		t.Fatalf("the run's checkpoint: %v %v", err, st.Err())
	}
	ckName, ckSHA := st.Msg().Name, st.Msg().Sha256
	ckBytes := st.Msg().Data
	for st.Receive() {
		ckBytes = append(ckBytes, st.Msg().Data...)
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	st.Close()
	// The run's last checkpoint, written as it ended, is its model.
	if ckName != "ckpt-00000030.pt" {
		t.Errorf("the broker's checkpoint of the run is %s, want the last one, ckpt-00000030.pt", ckName)
	}

	withAPI := regtest.StartInProcessRegistry(t, true, nil)
	noAPI, storage := regtest.StartRegistryStorage(t)

	t.Run("--file", func(t *testing.T) {
		// The run's own checkpoint named as a file is still the run's;
		// another file is attested as what it is.
		same, other := filepath.Join(dir, "final.pt"), filepath.Join(dir, "tuned.pt")
		if err := os.WriteFile(same, ckBytes, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(other, append(ckBytes, 0), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ file, name, source string }{{same, ckName, model.SourceCheckpoint}, {other, "tuned.pt", model.SourceFile}} {
			out, all, code := gp("model", "push", run.Id, withAPI+"/team/file:v1", "--key", key, "--file", tc.file, "--plain-http", "-o", "json")
			var res model.PushResult
			if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Model.Name != tc.name || res.Model.Source != tc.source {
				t.Errorf("model push --file %s: exit %d, model %+v; want %s from %s\n%s", tc.file, code, res.Model, tc.name, tc.source, all)
			}
		}
		// A run without --resume-elsewhere shipped nothing: --file is the fix.
		plain := stack.Command(ctx, "train", "--spec", "examples/train/gpupass.yaml", "--region", "us-west-2",
			"--workdir", "examples/train", "--name", "model-e2e-plain", "--follow", "--", py, "-c", "pass")
		if out, err := plain.CombinedOutput(); err != nil {
			t.Fatalf("train: %v\n%s", err, out)
		}
		runs, err := rc.Run.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		var plainID string
		for _, r := range runs.Msg.Runs {
			if r.Id != run.Id {
				plainID = r.Id
			}
		}
		_, all, code := gp("model", "push", plainID, withAPI+"/team/file:v2", "--key", key, "--plain-http")
		if code != 2 || !strings.Contains(all, "--file") || !strings.Contains(all, "shipped no checkpoint") || !strings.Contains(all, "--resume-elsewhere") {
			t.Errorf("model push of a run that shipped no checkpoint: exit %d, want 2 naming --file and why\n%s", code, all)
		}
	})
	for _, reg := range []struct{ name, host string }{{"referrers API", withAPI}, {"tag fallback", noAPI}} {
		t.Run(reg.name, func(t *testing.T) {
			ref := reg.host + "/team/model:v1"
			out, all, code := gp("model", "push", run.Id, ref, "--key", key, "--audit", zip, "--plain-http", "-o", "json")
			if code != 0 {
				t.Fatalf("model push: exit %d\n%s", code, all)
			}
			var pushed struct {
				model.PushResult
				Verify string `json:"verify_command"`
			}
			if err := json.Unmarshal([]byte(out), &pushed); err != nil {
				t.Fatalf("model push -o json printed non-JSON: %v\n%s", err, out)
			}
			p := pushed.Predicate
			if pushed.Model.SHA256 != ckSHA || pushed.Model.Name != ckName || pushed.Model.Source != model.SourceCheckpoint ||
				p.Run.ID != run.Id || p.SpecFingerprint != run.SpecFingerprint || len(p.Nodes) != 1 || p.Nodes[0].NodeID != run.NodeId ||
				p.Audit == nil || p.Metrics == nil || p.Metrics.LastStep != 30 || !strings.HasPrefix(pushed.Reference, reg.host+"/team/model@sha256:") {
				t.Fatalf("model push = %+v, want the run's checkpoint %s (%s) with its evidence", pushed, ckName, ckSHA)
			}

			// The printed verify command, pasted.
			_, text, code := gp("model", "push", run.Id, ref, "--key", key, "--audit", zip, "--plain-http")
			if code != 0 {
				t.Fatalf("model push: exit %d\n%s", code, text)
			}
			t.Logf("model push printed:\n%s", text)
			var pasted string
			for _, l := range strings.Split(text, "\n") {
				if s := strings.TrimSpace(l); strings.HasPrefix(s, "gpupass model verify ") {
					pasted = s
				}
			}
			if !strings.HasPrefix(pasted, "gpupass model verify "+reg.host+"/team/model@sha256:") || !strings.HasPrefix(pushed.Verify, "gpupass model verify "+pushed.Reference+" ") {
				t.Fatalf("push printed no verify command of the pushed digest (-o json: %q):\n%s", pushed.Verify, text)
			}
			sh := exec.CommandContext(ctx, "sh", "-c", pasted)
			sh.Env = append(stack.Env, "PATH="+stack.Bin+":"+os.Getenv("PATH"))
			sh.Dir = stack.Root
			vout, verr, code := testutil.Run(t, sh)
			if code != 0 || !strings.Contains(vout, "verified "+reg.host+"/team/model@sha256:") || !strings.Contains(vout, "ok   model") {
				t.Fatalf("the pasted %q: exit %d\n%s%s", pasted, code, vout, verr)
			}
			t.Logf("the pasted verify printed:\n%s", vout)
			for _, want := range []string{"run       " + run.Id, "node      " + run.NodeId, "metrics   last step 30", "audit     audit-report.zip"} {
				if !strings.Contains(vout, want) {
					t.Errorf("verify output lacks %q:\n%s", want, vout)
				}
			}
			via := "referrers API"
			if reg.host == noAPI {
				via = "tag sha256-"
			}
			if !strings.Contains(vout, via) {
				t.Errorf("verify does not say it found the attestation through the %s:\n%s", via, vout)
			}

			cosignVerify(t, ctx, cosign, pub, root, pushed.Reference, run.Id)
			// cosign tree reads referrers only with --experimental-oci11;
			// go-containerregistry's registry reports the config's media
			// type as the referrer's artifact type, so the digest is what
			// both registries show alike.
			attDigest := pushed.Attestation[strings.Index(pushed.Attestation, "@")+1:]
			tree, terr, code := testutil.Run(t, exec.CommandContext(ctx, cosign, "tree", "--experimental-oci11", "--allow-http-registry", pushed.Reference))
			if code != 0 || !strings.Contains(tree, "artifacts via OCI referrer: "+reg.host+"/team/model@"+attDigest) {
				t.Errorf("cosign tree: exit %d, want the attestation %s listed\n%s%s", code, pushed.Attestation, tree, terr)
			}
			disc, derr, code := testutil.Run(t, exec.CommandContext(ctx, oras, "discover", "--plain-http", "--format", "json", pushed.Reference))
			if code != 0 || !strings.Contains(disc, attDigest) || !strings.Contains(disc, `"dev.sigstore.bundle.predicateType": "`+model.PredicateType+`"`) {
				t.Errorf("oras discover: exit %d, want the attestation listed\n%s%s", code, disc, derr)
			}
			t.Logf("cosign tree:\n%s\noras discover: %s", tree, disc)

			if reg.host != noAPI {
				return
			}
			// One byte of the checkpoint changed where docker-registry
			// keeps it: cosign still passes, model verify does not.
			blob := filepath.Join(storage, "docker/registry/v2/blobs/sha256", ckSHA[:2], ckSHA, "data")
			b, err := os.ReadFile(blob)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0x01
			if err := os.WriteFile(blob, b, 0o644); err != nil {
				t.Fatal(err)
			}
			cosignVerify(t, ctx, cosign, pub, root, pushed.Reference, run.Id)
			jout, all, code := gp("model", "verify", pushed.Reference, "--key", pub, "--plain-http", "-o", "json")
			var res model.Result
			if err := json.Unmarshal([]byte(jout), &res); err != nil {
				t.Fatalf("model verify -o json printed non-JSON: %v\n%s", err, all)
			}
			if code != 1 || res.OK || res.FailedLayer != model.LayerModel {
				t.Fatalf("model verify of a changed checkpoint: exit %d, %+v; want 1 failing the model layer\n%s", code, res, all)
			}
			t.Logf("changed byte: cosign verify-attestation passes, gpupass model verify fails: %s", res.Layers[len(res.Layers)-1].Problems[0].Message)
		})
	}
}

// cosignVerify runs stock cosign verify-attestation on ref and checks the
// predicate it prints is the run's. The trusted root is the empty one:
// the referrer is a sigstore bundle, so cosign verifies it as one and
// wants a trusted root even for a key.
func cosignVerify(t *testing.T, ctx context.Context, cosign, pub, root, ref, run string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, cosign, "verify-attestation", "--key", pub, "--type", model.PredicateType,
		"--trusted-root", root, "--insecure-ignore-tlog=true", "--allow-http-registry", ref)
	out, errOut, code := testutil.Run(t, cmd)
	if code != 0 {
		t.Fatalf("cosign verify-attestation: exit %d\n%s%s", code, out, errOut)
	}
	var env struct {
		Payload string `json:"payload"`
	}
	line, _, _ := strings.Cut(out, "\n")
	if err := json.Unmarshal([]byte(line), &env); err != nil {
		t.Fatalf("cosign printed no DSSE envelope: %v\n%s", err, out)
	}
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatal(err)
	}
	var st model.Statement
	if err := json.NewDecoder(bytes.NewReader(payload)).Decode(&st); err != nil || st.PredicateType != model.PredicateType || st.Predicate.Run.ID != run {
		t.Fatalf("cosign's verified statement = %+v (%v), want the run's %s", st, err, run)
	}
}
