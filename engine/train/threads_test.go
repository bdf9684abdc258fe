package train

import (
	"runtime"
	"testing"
)

// TestThreadsFollowBinding: a rank bound by gtrain run --bind computes on
// its own CPUs (GTRAIN_CPUS), not on the host's cores divided among the
// host's ranks, which undercounts them (NumCPU is already the rank's
// affinity); a spec's threads still win.
func TestThreadsFollowBinding(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		env  Env
		want int
	}{
		{"bound: its CPUs", Spec{}, Env{CPUs: 3, LocalWorld: 2}, 3},
		{"the spec wins", Spec{Threads: 5}, Env{CPUs: 3, LocalWorld: 2}, 5},
		{"unbound: the host's cores shared", Spec{}, Env{LocalWorld: 1}, runtime.NumCPU()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.spec.threads(tt.env); got != tt.want {
				t.Errorf("threads = %d, want %d", got, tt.want)
			}
		})
	}
}
