package launch

import (
	"testing"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// TestWorldRankCPUs: the CPUs the planner is told each rank computes on
// are the fewest that --bind gives a rank on the hosts as they reported
// themselves; none when the ranks are not bound or a host reported nothing.
func TestWorldRankCPUs(t *testing.T) {
	smt := smtHost("epyc", 2, 4) // 2 nodes × 4 cores × 2 threads
	small := smtHost("small", 2, 4)
	small.Cgroup.CPUSet = []int{0, 1, 8, 9, 4, 12} // 2 cores of node 0, 1 of node 1
	three := []Host{{Name: "a", Slots: span(0, 2)}, {Name: "b", Slots: span(0, 2)}}
	for _, tt := range []struct {
		name  string
		bind  BindMode
		facts []*hostinfo.Host
		want  int
	}{
		{"core: 2 ranks share node 0's 4 cores, 1 has node 1's", BindCore, []*hostinfo.Host{&smt, &smt}, 4},
		{"auto is numa for 3 ranks: node 0's 8 threads shared by 2", BindAuto, []*hostinfo.Host{&smt, &smt}, 4},
		{"core within a cgroup's cpuset: a core each on node 0", BindCore, []*hostinfo.Host{&smt, &small}, 2},
		{"none", BindNone, []*hostinfo.Host{&smt, &smt}, 0},
		{"no --bind", "", []*hostinfo.Host{&smt, &smt}, 0},
		{"a host without facts", BindCore, []*hostinfo.Host{&smt, nil}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := World{Hosts: three, Facts: tt.facts, Bind: tt.bind, Size: 6, Slots: []int{3, 3}}
			if got := w.RankCPUs(); got != tt.want {
				t.Errorf("RankCPUs = %d, want %d", got, tt.want)
			}
		})
	}
}
