//go:build e2e

package main_test

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx": the attacker reads the PostgreSQL store
	_ "modernc.org/sqlite"             // database/sql driver "sqlite": the attacker reads the copied file

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// loot is what a reader of the database takes for one agent: every
// 32-byte value of its row in a session table (a key, or whatever the
// broker keeps instead) and the row's epoch.
type loot struct {
	agent string
	epoch uint64
	blobs [][]byte
}

// readSessions reads every table whose name says "session" from a copy
// of the store, as a reader with no knowledge of the schema would.
func readSessions(t *testing.T, db *sql.DB, tablesQuery string) map[string]*loot {
	t.Helper()
	rows, err := db.Query(tablesQuery)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	rows.Close()
	if len(tables) == 0 {
		t.Fatal("the copy of the store has no session table: the test no longer finds what a reader finds")
	}
	out := map[string]*loot{}
	for _, tab := range tables {
		rows, err := db.Query("SELECT * FROM " + tab)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			l := &loot{}
			for i, v := range vals {
				switch v := v.(type) {
				case string:
					if strings.HasPrefix(v, "agt-") {
						l.agent = v
					}
				case []byte:
					if strings.HasPrefix(string(v), "agt-") {
						l.agent = string(v)
					} else if len(v) == api.SessionKeyBytes {
						l.blobs = append(l.blobs, v)
					}
				case int64:
					if cols[i] == "epoch" {
						l.epoch = uint64(v)
					}
				}
			}
			if l.agent != "" {
				out[l.agent] = l
			}
		}
		rows.Close()
	}
	return out
}

// copySQLite copies the store's files (database, -wal, -shm) as a local
// reader would, and opens the copy read-only.
func copySQLite(t *testing.T, path string) *sql.DB {
	t.Helper()
	dir := t.TempDir()
	for _, sfx := range []string{"", "-wal", "-shm"} {
		b, err := os.ReadFile(path + sfx)
		if err != nil {
			if sfx != "" && os.IsNotExist(err) {
				continue
			}
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "copy.db"+sfx), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "copy.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// umask022 is a wrapper that starts bin under the usual umask (022), so
// a file the broker leaves to the umask is readable by every local user.
func umask022(t *testing.T, bin string) string {
	t.Helper()
	w := filepath.Join(t.TempDir(), "umask022")
	if err := os.WriteFile(w, []byte("#!/bin/sh\numask 022\nexec "+bin+" \"$@\"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestStoreCopyCannotActAsNode (issue #31): a real broker (SQLite file and
// PostgreSQL) and a real agent running a run. Whoever reads the store (a
// copy of the SQLite files, the PostgreSQL tables as a dump holds them)
// and holds an agent token of the node's region must not be able to act
// as the node: a heartbeat MACed with what the store holds is refused,
// and so is reporting the node's running run FAILED with the fence read
// from the store; the run goes on and succeeds. The SQLite files are the
// owner's alone (0600) though the broker runs under umask 022. A broker
// restart (which forgets every key) does not make the real agent enroll
// again: it shows the restarted broker its key once. Upgrading a store
// that held keys in clear retires them: the agent enrolls again on its
// own.
func TestStoreCopyCannotActAsNode(t *testing.T) {
	brokerBin := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	agentBin := testutil.BuildBinary(t, "./cmd/gpupass-agent")
	cliBin := testutil.BuildBinary(t, "./cmd/gpupass")
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			bdb := brokertest.NewDB(t, kind)
			db := bdb.URL()
			const region = "ap-south-1"
			agentTok, submitTok := tokenCreate(t, brokerBin, db, "agent", region), tokenCreate(t, brokerBin, db, "submit", "*")
			env := []string{"GPUPASS_HEARTBEAT_INTERVAL=1s", "GPUPASS_OFFLINE_AFTER=20s"}
			br := startReplica(t, umask022(t, brokerBin), db, env...)

			state := t.TempDir()
			agentLog := &testutil.Buffer{}
			agent := exec.Command(agentBin, "--broker-url", br.url,
				"--region", region, "--provider", "local", "--hostname", "node-1", "--state-dir", state,
				"--simulate", "a100-80gb-4x", "--python", upstack.Python, "--query-addr", "127.0.0.1:0",
				"--read-probe-mb", "1", "--suite-interval", "1m", "--price-per-hour", "2.5", "--storage-class", "standard", "--bandwidth-gbps", "25")
			agent.Env = append(os.Environ(), "GPUPASS_BROKER_TOKEN="+agentTok)
			agent.Stderr = agentLog
			agent.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := agent.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = agent.Process.Kill()
				_, _ = agent.Process.Wait()
				if t.Failed() {
					t.Logf("--- agent (tail)\n%s", upstack.Tail(agentLog.String(), 4000))
				}
			})
			nc, err := client.Dial(br.url, client.Options{Token: submitTok})
			if err != nil {
				t.Fatal(err)
			}
			rc, err := client.DialRuns(br.url, client.Options{Token: submitTok})
			if err != nil {
				t.Fatal(err)
			}
			var nodeID string
			upstack.WaitFor(t, ctx, "the node to certify", func() bool {
				resp, err := nc.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
				if err != nil || len(resp.Msg.Nodes) != 1 || !resp.Msg.Nodes[0].Online || !resp.Msg.Nodes[0].ConformancePassed {
					return false
				}
				nodeID = resp.Msg.Nodes[0].Id
				return true
			})

			train := exec.CommandContext(ctx, cliBin, "--output", "json", "train", "--spec", "examples/train/gpupass.yaml",
				"--region", region, "--workdir", t.TempDir(), "--name", "victim", "--", "sh", "-c", "sleep 12; echo done")
			train.Env = append(os.Environ(), "GPUPASS_BROKER_URL="+br.url, "GPUPASS_BROKER_TOKEN="+submitTok)
			train.Dir = testutil.RepoRoot(t)
			out, err := train.Output()
			if err != nil {
				t.Fatalf("gpupass train: %v\n%s", err, out)
			}
			var list runview.List
			if err := json.Unmarshal(out, &list); err != nil || len(list.Runs) != 1 {
				t.Fatalf("train --output json printed %q (%v)", out, err)
			}
			id := list.Runs[0].ID
			getRun := func() *gpupassv1.Run {
				resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
				if err != nil {
					return nil
				}
				return resp.Msg.Run
			}
			upstack.WaitFor(t, ctx, "the run to run", func() bool {
				r := getRun()
				return r != nil && r.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING
			})

			// The reader's copy.
			var copyDB *sql.DB
			tablesQuery := `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE '%session%'`
			if kind == "sqlite" {
				path := strings.TrimPrefix(db, "sqlite://")
				for _, sfx := range []string{"", "-wal", "-shm"} {
					fi, err := os.Stat(path + sfx)
					if err != nil {
						t.Fatalf("store file %s: %v", filepath.Base(path+sfx), err)
					}
					if fi.Mode().Perm() != 0o600 {
						t.Errorf("store file %s is %v under umask 022, want -rw------- (0600)", filepath.Base(path+sfx), fi.Mode().Perm())
					}
				}
				copyDB = copySQLite(t, path)
				tablesQuery = `SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%session%'`
			} else {
				copyDB, err = sql.Open("pgx", db)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { copyDB.Close() })
			}
			stolen := readSessions(t, copyDB, tablesQuery)[nodeID]
			if stolen == nil || len(stolen.blobs) == 0 || stolen.epoch == 0 {
				t.Fatalf("the store holds no session row for %s (%+v): the test no longer finds what a reader finds", nodeID, stolen)
			}
			var fence uint64
			var onNode string
			if err := copyDB.QueryRow(`SELECT node_id, fence FROM allocs WHERE id = '`+id+`'`).Scan(&onNode, &fence); err != nil || onNode != nodeID || fence == 0 {
				t.Fatalf("reading the run's fence from the copy: node %q fence %d, %v", onNode, fence, err)
			}

			// The attacker holds an agent token of the node's region.
			attackTok := tokenCreate(t, brokerBin, db, "agent", region)
			ac, err := client.Dial(br.url, client.Options{Token: attackTok, GRPC: true})
			if err != nil {
				t.Fatal(err)
			}
			for i, k := range stolen.blobs {
				// A beat MACed with what the store holds; sent with the
				// value as the key too, should the broker ask for one.
				for _, show := range []bool{false, true} {
					req := &gpupassv1.HeartbeatRequest{AgentId: nodeID, Counter: uint64(time.Now().UnixNano()) + 1<<40, SessionEpoch: stolen.epoch}
					req.Mac = api.HeartbeatMAC(k, req)
					r := connect.NewRequest(req)
					if show {
						r.Header().Set("Gpupass-Session-Key", base64.RawURLEncoding.EncodeToString(k))
					}
					if resp, err := ac.Agent.Heartbeat(ctx, r); err == nil {
						t.Errorf("heartbeat as %s MACed with value %d of its session row (key sent: %v) was taken (stale echo %v): a copy of the store acts as the node", nodeID, i, show, resp.Msg.StaleEcho)
					}
				}
				// The run reported FAILED through the agent call proof
				// gpupass-agent uses, with that value as the session key.
				creds := &api.AgentCredentials{}
				creds.Set(nodeID, k, stolen.epoch, 0)
				wc, err := client.DialRuns(br.url, client.Options{Token: attackTok, GRPC: true, Agent: creds})
				if err != nil {
					t.Fatal(err)
				}
				_, err = wc.Work.UpdateAllocation(ctx, connect.NewRequest(&gpupassv1.UpdateAllocationRequest{AgentId: nodeID, AllocId: id, FencingToken: fence,
					State: gpupassv1.AllocState_ALLOC_STATE_FAILED, Reason: "GPU 3 fell off the bus (made up)", NodeFault: gpupassv1.NodeFault_NODE_FAULT_LAUNCH}))
				if err == nil {
					t.Errorf("reporting %s's run FAILED with value %d of its session row and the fence from the store was taken", nodeID, i)
				} else if c := connect.CodeOf(err); c != connect.CodePermissionDenied && c != connect.CodeUnauthenticated {
					t.Errorf("reporting the run FAILED with what the store holds: %v; want permission_denied or unauthenticated", err)
				}
			}
			if r := getRun(); r == nil || r.State != gpupassv1.AllocState_ALLOC_STATE_RUNNING {
				t.Fatalf("after the attempts the run is %v, want still running", r)
			}

			// A restarted broker knows no key, only what the store holds:
			// the agent shows it its key once and carries on, without a
			// new enrollment (the epoch stays).
			_ = br.cmd.Process.Signal(syscall.SIGTERM)
			_, _ = br.cmd.Process.Wait()
			addr := strings.TrimPrefix(br.url, "http://")
			br2 := startReplicaAt(t, brokerBin, db, addr, env...)
			var r *gpupassv1.Run
			upstack.WaitFor(t, ctx, "the run to finish", func() bool {
				r = getRun()
				return r != nil && (r.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED || r.State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED)
			})
			if r.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED {
				t.Fatalf("run %s (%s), want succeeded", r.State, r.Reason)
			}
			since := time.Now()
			upstack.WaitFor(t, ctx, "a heartbeat to the restarted broker", func() bool {
				resp, err := nc.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
				return err == nil && len(resp.Msg.Nodes) == 1 && resp.Msg.Nodes[0].Online && resp.Msg.Nodes[0].LastSeenUnixNano > since.UnixNano()
			})
			if kind == "sqlite" {
				copyDB = copySQLite(t, strings.TrimPrefix(db, "sqlite://"))
			}
			if now := readSessions(t, copyDB, tablesQuery)[nodeID]; now == nil || now.epoch != stolen.epoch {
				t.Errorf("after the broker restart the node's session epoch is %+v, want %d still (no new enrollment)", now, stolen.epoch)
			}
			if strings.Contains(agentLog.String(), "enrolling again") {
				t.Errorf("the agent enrolled again after the broker restart:\n%s", upstack.Tail(agentLog.String(), 2000))
			}

			// An upgrade from a store that held keys in clear: the store
			// is put back to schema 8, the last release's (the old table,
			// holding a key for the node as an old broker wrote it, and no
			// admissions table, no run groups, webhooks, queue, group CI
			// context or gangs), and the broker started on it migrates
			// through 9 to 15 at once. No stored key
			// survives, so the agent's key is refused and the agent enrolls
			// again on its own, for epoch 1, and beats on.
			_ = br2.cmd.Process.Signal(syscall.SIGTERM)
			_, _ = br2.cmd.Process.Wait()
			rw, err := sql.Open(map[string]string{"sqlite": "sqlite", "postgres": "pgx"}[kind], map[string]string{"sqlite": "file:" + strings.TrimPrefix(db, "sqlite://"), "postgres": db}[kind])
			if err != nil {
				t.Fatal(err)
			}
			blob := map[string]string{"sqlite": "BLOB", "postgres": "BYTEA"}[kind]
			for _, q := range []string{
				`DROP TABLE agent_session_verifiers`,
				`CREATE TABLE agent_sessions (agent_id TEXT PRIMARY KEY, session_key ` + blob + ` NOT NULL, epoch BIGINT NOT NULL, issued_at BIGINT NOT NULL)`,
				`INSERT INTO agent_sessions VALUES ('` + nodeID + `', ` + map[string]string{"sqlite": "x'", "postgres": "'\\x"}[kind] + strings.Repeat("ab", 32) + `', 7, 1)`,
				`DROP TABLE node_admissions`,
				// Schema 11 and 12 (run groups, webhooks) came later.
				`DROP INDEX allocs_group`,
				`DROP INDEX allocs_updated`,
				`ALTER TABLE allocs DROP COLUMN group_id`,
				`ALTER TABLE allocs DROP COLUMN group_size`,
				`DROP TABLE webhook_attempts`,
				`DROP TABLE webhook_deliveries`,
				`DROP TABLE webhooks`,
				// Schema 13 and 14 (the queue, a group's CI context).
				`DROP INDEX allocs_queue`,
				`ALTER TABLE allocs DROP COLUMN queued_at`,
				`DROP TABLE group_ci`,
				// Schema 15 (the ranks of a gang).
				`DROP INDEX allocs_gang`,
				`ALTER TABLE allocs DROP COLUMN gang_id`,
				`ALTER TABLE agents DROP COLUMN job_address`,
				`ALTER TABLE agents DROP COLUMN job_port_min`,
				`ALTER TABLE agents DROP COLUMN job_port_max`,
				`DELETE FROM schema_migrations WHERE version >= 9`,
			} {
				if _, err := rw.Exec(q); err != nil {
					t.Fatalf("putting the store back to schema 8: %s: %v", q, err)
				}
			}
			rw.Close()
			br3 := startReplicaAt(t, brokerBin, db, addr, env...)
			upstack.WaitFor(t, ctx, "the agent to enroll again after the upgrade", func() bool {
				return strings.Contains(agentLog.String(), "heartbeat refused; enrolling again for a new session key")
			})
			since = time.Now()
			upstack.WaitFor(t, ctx, "a heartbeat with the new key", func() bool {
				resp, err := nc.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
				return err == nil && len(resp.Msg.Nodes) == 1 && resp.Msg.Nodes[0].Online && resp.Msg.Nodes[0].LastSeenUnixNano > since.UnixNano()
			})
			if kind == "sqlite" {
				copyDB = copySQLite(t, strings.TrimPrefix(db, "sqlite://"))
			}
			tablesQuery = strings.Replace(tablesQuery, "'%session%'", "'%session%' AND "+map[string]string{"sqlite": "name", "postgres": "table_name"}[kind]+" <> 'agent_sessions'", 1)
			if now := readSessions(t, copyDB, tablesQuery)[nodeID]; now == nil || now.epoch != 1 {
				t.Errorf("after the upgrade the node's session is %+v, want a new enrollment's, epoch 1", now)
			}

			for _, l := range []string{br.log.String(), br2.log.String(), br3.log.String()} {
				for _, k := range stolen.blobs {
					if strings.Contains(l, base64.RawURLEncoding.EncodeToString(k)) || strings.Contains(l, fmt.Sprintf("%x", k)) {
						t.Error("the broker log holds a value of the session row")
					}
				}
			}
		})
	}
}
