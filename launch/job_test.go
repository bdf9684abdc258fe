package launch

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/usage"
)

func twoNodes() []hostfiles.Node {
	return []hostfiles.Node{
		{Host: hostfiles.Host{Name: "worker-0", Slots: 4}, SlotIDs: []int{1, 3}},
		{Host: hostfiles.Host{Name: "worker-1", Slots: 3, Port: 2222, User: "alice"}, SlotIDs: []int{0, 1, 2}},
	}
}

func noEnv(string) string { return "" }

// TestJobRankEnv checks the torchrun contract rank by rank on a two-node,
// uneven job: global ranks follow hosts in order, then slots in order.
func TestJobRankEnv(t *testing.T) {
	p, err := NewJob(JobOptions{Nodes: twoNodes(), FromHostfile: true, Command: []string{"x"},
		MasterPort: 4321, RunID: "job-1", MaxRestarts: 3, Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		rank int
		want map[string]string
	}{
		{0, map[string]string{"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GTRAIN_SLOT": "1", "CUDA_VISIBLE_DEVICES": "1,3", "GTRAIN_HOST": "worker-0"}},
		{1, map[string]string{"RANK": "1", "LOCAL_RANK": "1", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GTRAIN_SLOT": "3", "CUDA_VISIBLE_DEVICES": "1,3"}},
		{2, map[string]string{"RANK": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "3", "GTRAIN_SLOT": "0", "CUDA_VISIBLE_DEVICES": "0,1,2", "GTRAIN_HOST": "worker-1"}},
		{4, map[string]string{"RANK": "4", "LOCAL_RANK": "2", "GROUP_RANK": "1", "ROLE_RANK": "4", "GTRAIN_SLOT": "2"}},
	}
	common := map[string]string{
		"WORLD_SIZE": "5", "GROUP_WORLD_SIZE": "2", "ROLE_NAME": "default", "ROLE_WORLD_SIZE": "5",
		"MASTER_PORT":               "4321", // pinned; MASTER_ADDR is determined at launch for remote hosts "TORCHELASTIC_RESTART_COUNT": "0",
		"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "job-1", "TORCHELASTIC_USE_AGENT_STORE": "False",
		"GTRAIN_RUN_ID": "job-1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1",
		"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
	}
	if _, ok := p.Ranks[0].Env["MASTER_ADDR"]; ok || p.MasterAddr != "" {
		t.Errorf("MASTER_ADDR = %q in the Job of a remote job; it is determined at launch", p.Ranks[0].Env["MASTER_ADDR"])
	}
	if len(p.Ranks) != 5 || p.WorldSize != 5 {
		t.Fatalf("ranks = %d, world = %d, want 5", len(p.Ranks), p.WorldSize)
	}
	for _, tt := range tests {
		t.Run(p.Ranks[tt.rank].Host+"/rank"+p.Ranks[tt.rank].Env["RANK"], func(t *testing.T) {
			env := p.Ranks[tt.rank].Env
			for _, want := range []map[string]string{common, tt.want} {
				for k, v := range want {
					if env[k] != v {
						t.Errorf("%s = %q, want %q", k, env[k], v)
					}
				}
			}
		})
	}
}

func TestJobLocal(t *testing.T) {
	nodes := []hostfiles.Node{{Host: hostfiles.Host{Name: "localhost", Slots: 1}, SlotIDs: []int{0}}}
	tests := []struct {
		name   string
		getenv func(string) string
		omp    string
	}{
		{"single rank: no OMP_NUM_THREADS", noEnv, ""},
		{"user's OMP_NUM_THREADS kept", func(k string) string {
			if k == "OMP_NUM_THREADS" {
				return "6"
			}
			return ""
		}, "6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewJob(JobOptions{Nodes: nodes, Command: []string{"x"}, Getenv: tt.getenv})
			if err != nil {
				t.Fatal(err)
			}
			env := p.Ranks[0].Env
			if env["OMP_NUM_THREADS"] != tt.omp {
				t.Errorf("OMP_NUM_THREADS = %q, want %q", env["OMP_NUM_THREADS"], tt.omp)
			}
			if _, ok := env["CUDA_VISIBLE_DEVICES"]; ok {
				t.Error("CUDA_VISIBLE_DEVICES set for a run without hostfile (torchrun leaves it alone)")
			}
			if p.MasterAddr != "127.0.0.1" || p.MasterPort == 0 || p.MasterPort == 29500 {
				t.Errorf("master = %s:%d, want 127.0.0.1 and a picked free port", p.MasterAddr, p.MasterPort)
			}
			if len(p.RunID) != 36 || strings.Count(p.RunID, "-") != 4 {
				t.Errorf("run id %q is not a UUID", p.RunID)
			}
		})
	}
}

// TestJobTorchVars checks the variables that torchrun sets only unless the
// user did: the user's choice, under either name of the NCCL watchdog's
// switch, with --env or inherited, is what the rank gets, and the old name
// never gets the new one beside it (PyTorch would take the new one).
func TestJobTorchVars(t *testing.T) {
	const (
		async, old, sigs = "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE"
		unset            = "<unset>"
	)
	tests := []struct {
		name      string
		env       []string          // --env
		inherited map[string]string // the launcher's environment
		want      map[string]string
	}{
		{"torchrun's defaults", nil, nil,
			map[string]string{async: "1", old: unset, sigs: "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}},
		{"inherited new name kept", nil, map[string]string{async: "0"},
			map[string]string{async: "0", old: unset}},
		{"inherited old name kept alone", nil, map[string]string{old: "0"},
			map[string]string{async: unset, old: "0"}},
		{"both inherited, both kept", nil, map[string]string{old: "0", async: "3"},
			map[string]string{async: "3", old: "0"}},
		{"--env new name", []string{async + "=2"}, map[string]string{old: "0"},
			map[string]string{async: "2", old: "0"}},
		{"--env old name kept alone", []string{old + "=0"}, nil,
			map[string]string{async: unset, old: "0"}},
		{"signals chosen", []string{sigs + "=SIGTERM"}, nil,
			map[string]string{sigs: "SIGTERM", async: "1"}},
		{"signals inherited", nil, map[string]string{sigs: "SIGINT"},
			map[string]string{sigs: "SIGINT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewJob(JobOptions{Nodes: twoNodes(), FromHostfile: true, Command: []string{"x"}, Env: tt.env,
				Getenv: func(k string) string { return tt.inherited[k] }})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range p.Ranks {
				for k, want := range tt.want {
					got, ok := r.Env[k]
					if !ok {
						got = unset
					}
					if got != want {
						t.Errorf("rank %d: %s = %s, want %s", r.Rank, k, got, want)
					}
				}
			}
		})
	}
}

func TestJobUserEnv(t *testing.T) {
	tests := []struct {
		env     []string
		wantErr string
	}{
		{[]string{"FOO=bar", "EMPTY="}, ""},
		{[]string{"RANK=3"}, "cannot be overridden"},
		{[]string{"NOEQUALS"}, "want KEY=VALUE"},
		{[]string{"=x"}, "want KEY=VALUE"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.env, ","), func(t *testing.T) {
			p, err := NewJob(JobOptions{Nodes: localNodes(2), Command: []string{"x"}, Env: tt.env, Getenv: noEnv})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if p.Ranks[1].Env["FOO"] != "bar" {
					t.Errorf("FOO = %q", p.Ranks[1].Env["FOO"])
				}
				return
			}
			var ue *usage.Error
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want usage error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestJobSpecAttempt(t *testing.T) {
	p, err := NewJob(JobOptions{Nodes: twoNodes(), Command: []string{"x"}, RunID: "r", Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	s := p.Assignment(1, 2)
	if s.Node != 1 || s.Host != "worker-1" || len(s.Ranks) != 3 || s.Attempt != 2 {
		t.Fatalf("spec = %+v", s)
	}
	env := strings.Join(s.Ranks[0].Env, "\n")
	for _, want := range []string{"RANK=2", "TORCHELASTIC_RESTART_COUNT=2", "GTRAIN_ATTEMPT=2"} {
		if !strings.Contains(env+"\n", want+"\n") {
			t.Errorf("attempt-2 env lacks %s:\n%s", want, env)
		}
	}
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv([]string{"A=1", "B=2", "C=3"}, []string{"B=20", "D=4"}, []string{"A=10"})
	want := []string{"A=10", "B=20", "C=3", "D=4"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mergeEnv = %q, want %q", got, want)
	}
	if got := withoutVars([]string{"A=1", "B=2"}, []string{"A"}); !reflect.DeepEqual(got, []string{"B=2"}) {
		t.Errorf("withoutVars = %q", got)
	}
}

func TestIsLocalHost(t *testing.T) {
	self, _ := os.Hostname()
	for name, want := range map[string]bool{
		"localhost": true, "127.0.0.1": true, "127.1.2.3": true, "::1": true, "[::1]": true,
		self: true, "worker-0": false, "10.0.0.1": false,
	} {
		if got := IsLocalHost(name); got != want {
			t.Errorf("IsLocalHost(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestReadErrorFile(t *testing.T) {
	dir := t.TempDir()
	tests := []struct{ name, body, want string }{
		{"torch record", `{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "..."}}}`, "ValueError: boom"},
		{"plain string", `{"message": "it broke"}`, "it broke"},
		{"garbage", `not json`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := dir + "/" + strings.ReplaceAll(tt.name, " ", "_")
			if err := os.WriteFile(path, []byte(tt.body), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := readErrorFile(path).Message; got != tt.want {
				t.Errorf("readErrorFile = %q, want %q", got, tt.want)
			}
		})
	}
	if got := readErrorFile(dir + "/missing").Message; got != "" {
		t.Errorf("missing file gave %q", got)
	}
}
