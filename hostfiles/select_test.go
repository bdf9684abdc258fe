package hostfiles

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

const testHostfile = `
worker-0 slots=4
worker-1 slots=2
alice@worker-2:2222 slots=3
[::1]:22 slots=2
`

func testHosts(t testing.TB, text string) []Host {
	t.Helper()
	hosts, err := Parse("hosts.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return hosts
}

// render writes nodes compactly: "worker-0:0,1 worker-1:1".
func render(nodes []Node) string {
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		ids := make([]string, len(n.SlotIDs))
		for j, id := range n.SlotIDs {
			ids[j] = fmt.Sprint(id)
		}
		parts[i] = n.Name + ":" + strings.Join(ids, ",")
	}
	return strings.Join(parts, " ")
}

func TestSelect(t *testing.T) {
	all := "worker-0:0,1,2,3 worker-1:0,1 worker-2:0,1,2 ::1:0,1"
	tests := []struct {
		name string
		f    Filter
		want string
	}{
		{"zero filter", Filter{}, all},
		{"include one host", Filter{Include: "worker-1"}, "worker-1:0,1"},
		{"include keeps hostfile order", Filter{Include: "worker-2@worker-0:3,1"}, "worker-0:1,3 worker-2:0,1,2"},
		{"include sorts slots", Filter{Include: "worker-0:3,0,2"}, "worker-0:0,2,3"},
		{"include every host", Filter{Include: "[::1]@worker-2@worker-1@worker-0"}, all},
		{"include IPv6 bare", Filter{Include: "::1"}, "::1:0,1"},
		{"include IPv6 slots", Filter{Include: "[::1]:1"}, "::1:1"},
		{"include IPv6 other spelling", Filter{Include: "[0::1]:0"}, "::1:0"},
		{"include ignores case", Filter{Include: "WORKER-1:1"}, "worker-1:1"},
		{"exclude whole host", Filter{Exclude: "worker-1"}, "worker-0:0,1,2,3 worker-2:0,1,2 ::1:0,1"},
		{"exclude slots", Filter{Exclude: "worker-0:1,3@[::1]:0"}, "worker-0:0,2 worker-1:0,1 worker-2:0,1,2 ::1:1"},
		{"exclude all slots drops host", Filter{Exclude: "worker-1:0,1"}, "worker-0:0,1,2,3 worker-2:0,1,2 ::1:0,1"},
		{"num nodes", Filter{NumNodes: 2}, "worker-0:0,1,2,3 worker-1:0,1"},
		{"num nodes all", Filter{NumNodes: 4}, all},
		{"num gpus", Filter{NumSlots: 2}, "worker-0:0,1 worker-1:0,1 worker-2:0,1 ::1:0,1"},
		{"num gpus checks only kept nodes", Filter{NumNodes: 1, NumSlots: 3}, "worker-0:0,1,2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hosts := testHosts(t, testHostfile)
			orig := slices.Clone(hosts)
			nodes, err := Select(hosts, tt.f)
			if err != nil {
				t.Fatalf("Select(%+v): %v", tt.f, err)
			}
			if got := render(nodes); got != tt.want {
				t.Errorf("Select(%+v)\n got %s\nwant %s", tt.f, got, tt.want)
			}
			for _, n := range nodes {
				if i := slices.IndexFunc(orig, func(h Host) bool { return h.Name == n.Name }); i < 0 || orig[i] != n.Host {
					t.Errorf("node host %+v is not an input host unchanged", n.Host)
				}
			}
			if !slices.Equal(hosts, orig) {
				t.Errorf("Select modified its input: %+v", hosts)
			}
		})
	}
}

func TestSelectErrors(t *testing.T) {
	tests := []struct {
		name string
		f    Filter
		msg  string // the whole message
	}{
		{"include and exclude", Filter{Include: "worker-0", Exclude: "worker-1"},
			"hostfiles: --include and --exclude cannot be used together: keep one"},
		{"include with num nodes", Filter{Include: "worker-0", NumNodes: 1},
			"hostfiles: --num-nodes cannot be combined with --include: list the hosts and slots in --include instead"},
		{"exclude with both limits", Filter{Exclude: "worker-0", NumNodes: 1, NumSlots: 1},
			"hostfiles: --num-nodes and --num-gpus cannot be combined with --exclude: list the hosts and slots in --exclude instead"},
		{"negative num nodes", Filter{NumNodes: -1}, "hostfiles: --num-nodes=-1: must be 0 (all hosts) or more"},
		{"negative num gpus", Filter{NumSlots: -2}, "hostfiles: --num-gpus=-2: must be 0 (all slots) or more"},
		{"too many nodes", Filter{NumNodes: 5},
			"hostfiles: --num-nodes=5: the hostfile has only 4 hosts (worker-0, worker-1, worker-2, ::1): lower --num-nodes"},
		{"too many gpus", Filter{NumSlots: 3},
			"hostfiles: --num-gpus=3: more slots than some hosts have (worker-1 has 2, ::1 has 2): lower --num-gpus"},
		{"unknown host", Filter{Include: "worker-9"},
			`hostfiles: --include "worker-9": unknown host "worker-9" (hosts: worker-0, worker-1, worker-2, ::1)`},
		{"unknown host in exclude", Filter{Exclude: "worker-0@nope:1"},
			`hostfiles: --exclude "worker-0@nope:1": unknown host "nope" (hosts: worker-0, worker-1, worker-2, ::1)`},
		{"user is not part of the name", Filter{Include: "alice"}, `unknown host "alice"`},
		{"slot out of range", Filter{Include: "worker-1:2"},
			`hostfiles: --include "worker-1:2": slot 2 out of range for host "worker-1": it has 2 slots (0-1)`},
		{"slot overflow", Filter{Exclude: "worker-1:99999999999999999999"},
			`slot 99999999999999999999 out of range for host "worker-1"`},
		{"negative slot", Filter{Include: "worker-1:-1"}, `invalid slot "-1" for host "worker-1"`},
		{"non-numeric slot", Filter{Include: "worker-1:a"}, `invalid slot "a" for host "worker-1"`},
		{"empty slot", Filter{Include: "worker-0:1,,2"}, `empty slot in "1,,2" for host "worker-0"`},
		{"trailing comma", Filter{Include: "worker-0:1,"}, `empty slot in "1," for host "worker-0"`},
		{"no slots after colon", Filter{Exclude: "worker-0:"}, `no slots after "worker-0:"`},
		{"slot twice", Filter{Include: "worker-0:1,1"}, `slot 1 listed twice for host "worker-0"`},
		{"host twice", Filter{Include: "worker-0:0@worker-0:1"}, `host "worker-0" is listed twice`},
		{"host twice other spelling", Filter{Exclude: "[::1]@0::1"}, `host "0::1" is listed twice`},
		{"double at", Filter{Include: "worker-0@@worker-1"}, `--include "worker-0@@worker-1": empty entry`},
		{"trailing at", Filter{Exclude: "worker-0@"}, `--exclude "worker-0@": empty entry`},
		{"leading at", Filter{Include: "@worker-0"}, "empty entry"},
		{"empty host name", Filter{Include: ":0"}, `empty host name in ":0"`},
		{"empty brackets", Filter{Include: "[]:0"}, `empty host name in "[]:0"`},
		{"unclosed bracket", Filter{Include: "[::1:0"}, `missing "]" in "[::1:0"`},
		{"junk after bracket", Filter{Include: "[::1]0"}, `unexpected "0" after "]"`},
		{"exclude everything", Filter{Exclude: "worker-0@worker-1@worker-2@[::1]"},
			`hostfiles: --exclude "worker-0@worker-1@worker-2@[::1]": every slot is excluded: leave at least one host or slot`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes, err := Select(testHosts(t, testHostfile), tt.f)
			if err == nil {
				t.Fatalf("Select(%+v) = %s, want error %q", tt.f, render(nodes), tt.msg)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "hostfiles: ") || !strings.Contains(msg, tt.msg) || strings.Contains(msg, "\n") {
				t.Errorf("Select(%+v) error\n got %q\nwant one line containing %q", tt.f, msg, tt.msg)
			}
		})
	}
}

func TestSelectBadHosts(t *testing.T) {
	tests := []struct {
		name  string
		hosts []Host
		msg   string
	}{
		{"no hosts", nil, "hostfiles: no hosts to select from"},
		{"zero slots", []Host{{Name: "a"}}, `hostfiles: host "a" has 0 slots: want 1 to 1024`},
		{"too many slots", []Host{{Name: "a", Slots: 1 << 40}}, `host "a" has 1099511627776 slots`},
		{"duplicate", []Host{{Name: "a", Slots: 1}, {Name: "A", Slots: 1}}, `hostfiles: duplicate host "A"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Select(tt.hosts, Filter{})
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Select(%+v) = %v, want error containing %q", tt.hosts, err, tt.msg)
			}
		})
	}
}

func TestUnknownHostListIsTruncated(t *testing.T) {
	var b strings.Builder
	for i := range 20 {
		fmt.Fprintf(&b, "w%d slots=1\n", i)
	}
	_, err := Select(testHosts(t, b.String()), Filter{Include: "x"})
	want := `unknown host "x" (hosts: w0, w1, w2, w3, w4, w5, w6, w7, ... and 12 more)`
	if err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Errorf("error = %v, want suffix %q", err, want)
	}
}

func TestAll(t *testing.T) {
	hosts := testHosts(t, testHostfile)
	got := All(hosts)
	want := "worker-0:0,1,2,3 worker-1:0,1 worker-2:0,1,2 ::1:0,1"
	if render(got) != want {
		t.Errorf("All = %s, want %s", render(got), want)
	}
	if sel, err := Select(hosts, Filter{}); err != nil || render(sel) != want {
		t.Errorf("Select(zero Filter) = %s, %v; want %s", render(sel), err, want)
	}
	if len(All(nil)) != 0 {
		t.Errorf("All(nil) is not empty")
	}
}

// TestSelectMaxRanks: a hostfile may list more slots than one job may use,
// but a selection of more than MaxRanks is refused.
func TestSelectMaxRanks(t *testing.T) {
	hosts := testHosts(t, manyHosts(MaxRanks/MaxSlotsPerHost+1, MaxSlotsPerHost))
	_, err := Select(hosts, Filter{})
	if err == nil || !strings.Contains(err.Error(), "66560 slots selected: a job has at most 65536 ranks") {
		t.Errorf("Select of every slot = %v, want the rank limit", err)
	}
	nodes, err := Select(hosts, Filter{NumNodes: MaxRanks / MaxSlotsPerHost})
	if err != nil || countSlots(nodes) != MaxRanks {
		t.Errorf("Select of %d hosts = %d slots, %v; want %d", MaxRanks/MaxSlotsPerHost, countSlots(nodes), err, MaxRanks)
	}
}
