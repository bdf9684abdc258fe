package launch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
)

func testRequest() Request {
	return Request{NprocPerNode: 1, Grace: time.Second, Heartbeat: time.Second, Getenv: func(string) string { return "" }}
}

// TestRequestResolve: the workload's command, environment, run id and
// rank count are combined with the flags' without either overwriting the
// other: --env-file first, then --env, then what the command decided.
func TestRequestResolve(t *testing.T) {
	dir := t.TempDir()
	envFile := filepath.Join(dir, "env")
	if err := os.WriteFile(envFile, []byte("A=file\nB=file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := testRequest()
	r.EnvFile, r.Env, r.RunID, r.Chdir = envFile, []string{"B=flag", "C=flag"}, "flags-id", dir
	job, err := r.Resolve(t.Context(), Workload{Command: []string{"true"}, Env: []string{"C=workload"}, RunID: "lock-id", NprocPerNode: 3})
	if err != nil {
		t.Fatal(err)
	}
	if job.WorldSize != 3 || job.RunID != "lock-id" || job.Dir != dir {
		t.Errorf("world %d, run id %q, dir %q; want 3, lock-id, %s", job.WorldSize, job.RunID, job.Dir, dir)
	}
	env := job.Ranks[2].Env
	if env["A"] != "file" || env["B"] != "flag" || env["C"] != "workload" {
		t.Errorf("A=%q B=%q C=%q; want file, flag, workload", env["A"], env["B"], env["C"])
	}
	if r.NprocPerNode != 1 || r.RunID != "flags-id" || len(r.Env) != 2 {
		t.Errorf("Resolve changed its request: %+v", r)
	}
	job, err = r.Resolve(t.Context(), Workload{Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if job.WorldSize != 1 || job.RunID != "flags-id" {
		t.Errorf("without a workload's choice: world %d, run id %q; want the flags' 1, flags-id", job.WorldSize, job.RunID)
	}
}

// TestRequestUsageErrors: each bad value is a usage error naming its flag.
func TestRequestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*Request)
		nproc int
		want  string
	}{
		{"nproc", func(*Request) {}, 0, "--nproc-per-node 0"},
		{"port", func(r *Request) { r.MasterPort = 70000 }, 1, "--master-port 70000"},
		{"restarts", func(r *Request) { r.MaxRestarts = -1 }, 1, "--max-restarts -1"},
		{"grace", func(r *Request) { r.Grace = -time.Second }, 1, "--grace-period -1s"},
		{"heartbeat", func(r *Request) { r.Heartbeat = time.Millisecond }, 1, "--heartbeat 1ms"},
		{"join", func(r *Request) { r.JoinTimeout = -time.Second }, 1, "--join-timeout -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRequest()
			tc.edit(&r)
			err := r.Check(tc.nproc)
			if !errors.As(err, new(*usage.Error)) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Check = %v, want a usage error naming %s", err, tc.want)
			}
		})
	}
	r := testRequest()
	r.Filter = hostfiles.Filter{NumNodes: 1}
	if _, _, err := r.Nodes(t.Context(), 1); !errors.As(err, new(*usage.Error)) || !strings.Contains(err.Error(), "give --hostfile") {
		t.Errorf("a filter without a hostfile: %v, want a usage error asking for --hostfile", err)
	}
}
