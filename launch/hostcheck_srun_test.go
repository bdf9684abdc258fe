package launch

import (
	"errors"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/usage"
)

// TestHostCheckLauncher: hosts check reaches the hosts as gtrain run
// starts its agents: srun with --launcher srun, or auto on --hostfile
// slurm inside an allocation; SSH otherwise. A --launcher of another
// name, or srun outside an allocation, is a usage error naming it.
func TestHostCheckLauncher(t *testing.T) {
	inside := func(k string) string {
		return map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}[k]
	}
	outside := func(string) string { return "" }
	for _, tc := range []struct {
		launcher, path string
		getenv         func(string) string
		srun           bool
		err            string
	}{
		{"", HostfileSlurm, inside, true, ""},
		{"auto", HostfileSlurm, inside, true, ""},
		{"auto", "hosts.txt", inside, false, ""},
		{"ssh", HostfileSlurm, inside, false, ""},
		{"srun", "hosts.txt", inside, true, ""},
		{"srun", "hosts.txt", outside, false, "--launcher srun: not inside a Slurm allocation"},
		{"pbs", HostfileSlurm, inside, false, `--launcher: want auto, ssh or srun, not "pbs"`},
	} {
		t.Run(tc.launcher+" "+tc.path, func(t *testing.T) {
			hc := &HostCheck{Launcher: tc.launcher}
			err := hc.useLauncher(tc.path, tc.getenv)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, new(*usage.Error)) {
					t.Fatalf("error %v, want a usage error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := hc.Srun != nil; got != tc.srun {
				t.Fatalf("srun %v, want %v", got, tc.srun)
			}
			if tc.srun && hc.Srun.JobID != "7" {
				t.Errorf("srun joins job %q, want the allocation's 7", hc.Srun.JobID)
			}
		})
	}
}
