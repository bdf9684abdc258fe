package hostfiles

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// hostlistCases are Slurm's own examples (the sbatch/srun man pages'
// --nodelist, the hostlist section of scontrol(1), multi-dimensional names
// from topology.conf's examples) and the edges, each as `scontrol show
// hostnames` (Slurm 22.05) expands it. slurmLenient marks a string Slurm
// reads leniently, or past gtrain's bounds, but gtrain refuses.
var hostlistCases = []struct {
	name, in     string
	want         []string
	err          string // substring of the error; "" = no error
	slurmLenient bool
}{
	{name: "doc lx range", in: "lx[10-12]", want: []string{"lx10", "lx11", "lx12"}},
	{name: "doc lx list", in: "lx[10,20]", want: []string{"lx10", "lx20"}},
	{name: "doc linux", in: "linux[0-2,128]", want: []string{"linux0", "linux1", "linux2", "linux128"}},
	{name: "doc plain names", in: "alpha,beta,gamma", want: []string{"alpha", "beta", "gamma"}},
	{name: "doc mixed", in: "lx[15,18,32-33]", want: []string{"lx15", "lx18", "lx32", "lx33"}},
	{name: "issue example", in: "node[01-04,07],gpu-[1-2]", want: []string{"node01", "node02", "node03", "node04", "node07", "gpu-1", "gpu-2"}},
	{name: "padding kept", in: "n[08-11]", want: []string{"n08", "n09", "n10", "n11"}},
	{name: "no padding grows", in: "n[9-10]", want: []string{"n9", "n10"}},
	{name: "padding from low bound", in: "n[008-11]", want: []string{"n008", "n009", "n010", "n011"}},
	{name: "high bound's zeros ignored", in: "n[1-02]", want: []string{"n1", "n2"}},
	{name: "single number keeps width", in: "n[007]", want: []string{"n007"}},
	{name: "digits only", in: "[1-2]", want: []string{"1", "2"}},
	{name: "two groups", in: "rack[1-2]-node[01-02]", want: []string{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"}},
	{name: "doc blades", in: "rack[0-1]_blade[0-2]", want: []string{"rack0_blade0", "rack0_blade1", "rack0_blade2", "rack1_blade0", "rack1_blade1", "rack1_blade2"}},
	{name: "adjacent groups", in: "n[1-2][3-4]", want: []string{"n13", "n14", "n23", "n24"}},
	{name: "three groups in Slurm's order", in: "a[1-2]b[1-2]c[1-2]", want: []string{"a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"}},
	{name: "duplicates kept", in: "n[1-2],n2", want: []string{"n1", "n2", "n2"}},
	{name: "case kept", in: "N[1-2],n1", want: []string{"N1", "N2", "n1"}},
	{name: "space separates", in: "a,b c", want: []string{"a", "b", "c"}},
	{name: "empty entries skipped", in: "a,,b", want: []string{"a", "b"}},
	{name: "leading comma", in: ",a", want: []string{"a"}},
	{name: "dots", in: "n[1-2].cluster", err: `after the last "]"`},
	{name: "backwards", in: "node[3-1]", err: `column 6: range 3-1 runs backwards`},
	{name: "empty brackets", in: "n[]", err: "empty range"},
	{name: "empty range in list", in: "n[1,,2]", err: "empty range"},
	{name: "letters", in: "n[a-b]", err: `range "a-b"`},
	{name: "negative", in: "n[-3]", err: `range "-3"`},
	{name: "double dash", in: "n[1--3]", err: `range "1--3"`},
	{name: "suffix", in: "n[1-3]x", err: `"x" after the last "]"`},
	{name: "suffix after groups", in: "x[1-2]y[3]z", err: `"z" after the last "]"`},
	{name: "stray close", in: "n[1-2]]", err: `"]" without "["`},
	{name: "nested", in: "n[[1-2]]", err: `"[" inside brackets`},
	{name: "too many in a range", in: "n[0-65536]", err: "more than 65536 hosts"},
	{name: "huge range", in: "n[0-99999999]", err: "more than 65536 hosts"},
	{name: "too many in all", in: "n[0-40000],m[0-40000]", err: "more than 65536 hosts in all", slurmLenient: true},
	{name: "too many across groups", in: "a[0-999]b[0-999]", err: "more than 65536 hosts in all", slurmLenient: true},
	{name: "open bracket", in: "n[1-3", err: `unclosed "["`, slurmLenient: true},
	{name: "open high", in: "n[1-]", err: `range "1-"`, slurmLenient: true},
	{name: "space in range", in: "n[ 1-2]", err: `range " 1-2"`, slurmLenient: true},
	{name: "bad character", in: "n@[1-2]", err: `host name "n@1"`, slurmLenient: true},
	{name: "leading dash", in: "x,-n", err: `host name "-n"`, slurmLenient: true},
	{name: "only commas", in: ",,", err: "no hosts"},
}

func TestExpandHostlist(t *testing.T) {
	for _, tc := range hostlistCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ExpandHostlist(tc.in)
			if tc.err != "" {
				var he *HostlistError
				if !errors.As(err, &he) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ExpandHostlist(%q) = %v, %v; want a *HostlistError containing %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("ExpandHostlist(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestExpandHostlistErrorText: the error names the list, the column and
// what to do.
func TestExpandHostlistErrorText(t *testing.T) {
	_, err := ExpandHostlist("node[3-1]")
	want := `hostfiles: hostlist "node[3-1]": column 6: range 3-1 runs backwards: write the low number first, 1-3`
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v\nwant    %s", err, want)
	}
}

// TestExpandHostlistLongPrefix: a long name times many numbers is refused
// before it is built.
func TestExpandHostlistLongPrefix(t *testing.T) {
	_, err := ExpandHostlist(strings.Repeat("a", 300) + "[1-65535]")
	if err == nil || !strings.Contains(err.Error(), "at most 253") {
		t.Fatalf("error = %v, want the name length refused", err)
	}
}

// TestExpandHostlistSlurm checks every case of the table against the real
// `scontrol show hostnames` where Slurm is installed (slurm-client): the
// same names where both accept, a refusal where gtrain refuses (except
// where Slurm is lenient).
func TestExpandHostlistSlurm(t *testing.T) {
	scontrol := needScontrol(t)
	for _, tc := range hostlistCases {
		t.Run(tc.name, func(t *testing.T) {
			names, refused := scontrol(t, tc.in)
			switch {
			case tc.err == "" && (refused || !slices.Equal(names, tc.want)):
				t.Fatalf("scontrol show hostnames %q = %s (refused %v); the table says %q", tc.in, short(names), refused, tc.want)
			case tc.err != "" && !tc.slurmLenient && !refused:
				t.Fatalf("scontrol show hostnames %q = %s; the table says Slurm refuses it", tc.in, short(names))
			case tc.err != "" && tc.slurmLenient && refused:
				t.Fatalf("scontrol refuses %q: the table marks it lenient", tc.in)
			}
		})
	}
}

// short prints at most the first 8 names.
func short(names []string) string {
	if len(names) > 8 {
		return fmt.Sprintf("%q... (%d names)", names[:8], len(names))
	}
	return fmt.Sprintf("%q", names)
}

// needScontrol returns a function that expands a hostlist with the real
// scontrol (with a minimal slurm.conf: show hostnames needs no
// controller), or skips t where Slurm is not installed.
func needScontrol(t testing.TB) func(*testing.T, string) ([]string, bool) {
	t.Helper()
	path, err := exec.LookPath("scontrol")
	if err != nil {
		t.Skip("scontrol not installed (apt-get install slurm-client): the table is not compared with Slurm")
	}
	conf := filepath.Join(t.TempDir(), "slurm.conf")
	if err := os.WriteFile(conf, []byte("ClusterName=t\nSlurmctldHost=localhost\nNodeName=x\nPartitionName=p Nodes=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return func(t *testing.T, list string) ([]string, bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, path, "show", "hostnames", list)
		cmd.Env = append(os.Environ(), "SLURM_CONF="+conf)
		// scontrol says "Invalid hostlist" on stderr and exits 0.
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("scontrol show hostnames %q: %v: %s", list, err, out)
		}
		names := strings.Fields(string(out))
		if len(names) == 0 || strings.Contains(string(out), "Invalid hostlist") {
			return nil, true
		}
		return names, false
	}
}

var tasksCases = []struct {
	in    string
	nodes int
	want  []int
	err   string
}{
	{in: "2(x3),1", nodes: 4, want: []int{2, 2, 2, 1}},
	{in: "1(x2)", nodes: 2, want: []int{1, 1}},
	{in: "8", nodes: 1, want: []int{8}},
	{in: "4,2(x2),1", nodes: 0, want: []int{4, 2, 2, 1}},
	{in: "2(x3)", nodes: 2, err: "counts for 3 nodes, but the allocation has 2"},
	{in: "0", err: `"0": want N or N(xR)`},
	{in: "2(x0)", err: `column 1: "2(x0)"`},
	{in: "1,2(x", err: `column 3: "2(x"`},
	{in: "", err: `"": want N`},
	{in: "1(x99999999)", err: `"1(x99999999)"`},
	{in: "1(x40000),1(x40000)", err: "more than 65536 nodes"},
	{in: "2048", err: "N from 1 to 1024"},
}

func TestExpandTasksPerNode(t *testing.T) {
	for _, tc := range tasksCases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ExpandTasksPerNode("SLURM_TASKS_PER_NODE", tc.in, tc.nodes)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "SLURM_TASKS_PER_NODE") {
					t.Fatalf("= %v, %v; want an error naming the variable, with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("= %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// FuzzExpandHostlist: no input panics or exceeds the bounds; every name
// is valid; a list of the expanded names expands to itself; and where
// scontrol exists (GTRAIN_FUZZ_SCONTROL=1, since each call runs it) what
// gtrain accepts, Slurm expands the same.
func FuzzExpandHostlist(f *testing.F) {
	for _, tc := range hostlistCases {
		f.Add(tc.in)
	}
	var scontrol func(*testing.T, string) ([]string, bool)
	if os.Getenv("GTRAIN_FUZZ_SCONTROL") == "1" {
		scontrol = needScontrol(f)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, err := ExpandHostlist(s)
		if err != nil {
			var he *HostlistError
			if !errors.As(err, &he) {
				t.Fatalf("error %v is not a *HostlistError", err)
			}
			return
		}
		if len(names) == 0 || len(names) > MaxHosts {
			t.Fatalf("%d names", len(names))
		}
		for _, n := range names {
			if !validName(n) || len(n) > 253 {
				t.Fatalf("invalid name %q from %q", n, s)
			}
		}
		again, err := ExpandHostlist(strings.Join(names, ","))
		if err != nil || !slices.Equal(again, names) {
			t.Fatalf("the names of %q do not expand to themselves: %v", s, err)
		}
		if scontrol != nil {
			if got, refused := scontrol(t, s); refused || !slices.Equal(got, names) {
				t.Fatalf("scontrol show hostnames %q = %s (refused %v), gtrain %s", s, short(got), refused, short(names))
			}
		}
	})
}

// FuzzExpandTasksPerNode: no input panics; counts stay in bounds.
func FuzzExpandTasksPerNode(f *testing.F) {
	for _, tc := range tasksCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		counts, err := ExpandTasksPerNode("SLURM_TASKS_PER_NODE", s, 0)
		if err != nil {
			return
		}
		if len(counts) == 0 || len(counts) > MaxHosts {
			t.Fatalf("%d counts", len(counts))
		}
		for _, c := range counts {
			if c < 1 || c > MaxSlotsPerHost {
				t.Fatalf("count %d", c)
			}
		}
	})
}
