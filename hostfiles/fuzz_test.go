package hostfiles

import (
	"errors"
	"strings"
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"worker-0 slots=8\nworker-1 slots=8\n",
		"alice@worker-0:2222 slots=4 max_slots=8 # comment\r\n",
		"w:4\n[::1]:4\n",
		"[fe80::1%eth0]:22 slots=1 max-slots=2\n::1 slots=2\n",
		"\uFEFF# only a comment\n\n",
		"w slots=1\nW slots=1\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data string) {
		hosts, err := Parse("fuzz", strings.NewReader(data))
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.File != "fuzz" || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q (%T) is not a one-line *ParseError for file fuzz", err, err)
			}
			return
		}
		checkHostsValid(t, data, hosts)
		checkRoundTrip(t, hosts)
	})
}

func checkHostsValid(t *testing.T, data string, hosts []Host) {
	t.Helper()
	lines := strings.Count(data, "\n") + 1
	names := make(map[string]bool)
	for _, h := range hosts {
		if h.Slots <= 0 || h.MaxSlots != 0 && h.MaxSlots < h.Slots {
			t.Errorf("host %+v: bad slots", h)
		}
		if h.Port < 0 || h.Port > 65535 {
			t.Errorf("host %+v: bad port", h)
		}
		if h.Line < 1 || h.Line > lines {
			t.Errorf("host %+v: line outside 1..%d", h, lines)
		}
		if names[h.Name] {
			t.Errorf("duplicate name %q", h.Name)
		}
		names[h.Name] = true
	}
}

// checkRoundTrip formats hosts in the long form and parses them again.
func checkRoundTrip(t *testing.T, hosts []Host) {
	t.Helper()
	var b strings.Builder
	for _, h := range hosts {
		b.WriteString(Format(h) + "\n")
	}
	again, err := Parse("formatted", strings.NewReader(b.String()))
	if err != nil {
		t.Fatalf("re-parsing formatted hosts:\n%s\nerror: %v", b.String(), err)
	}
	if len(again) != len(hosts) {
		t.Fatalf("round trip gave %d hosts, want %d", len(again), len(hosts))
	}
	for i, h := range hosts {
		h.Line = i + 1
		if again[i] != h {
			t.Errorf("round trip of %q: got %+v, want %+v", Format(h), again[i], h)
		}
	}
}

func FuzzSelect(f *testing.F) {
	f.Add(testHostfile, "worker-0:0,2@worker-1", "", 0, 0)
	f.Add(testHostfile, "", "worker-0:1@[::1]", 0, 0)
	f.Add(testHostfile, "", "", 2, 1)
	f.Add("a:2\nb:2", "a:1,0@b", "", 0, 0)
	f.Add("a:2\nb:2", "", "a:0,1@b:1", 0, 0)
	f.Add(testHostfile, "::1@@", "", 0, 0)
	f.Fuzz(func(t *testing.T, hostfile, include, exclude string, numNodes, numSlots int) {
		hosts, err := Parse("fuzz", strings.NewReader(hostfile))
		if err != nil {
			hosts = testHosts(t, testHostfile)
		}
		filter := Filter{Include: include, Exclude: exclude, NumNodes: numNodes, NumSlots: numSlots}
		nodes, err := Select(hosts, filter)
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "hostfiles: ") || strings.Contains(msg, "\n") {
				t.Fatalf("error %q is not one line starting with hostfiles:", msg)
			}
			return
		}
		checkSubset(t, hosts, nodes)
		if filter == (Filter{}) && render(nodes) != render(All(hosts)) {
			t.Errorf("zero Filter gave %s, want All: %s", render(nodes), render(All(hosts)))
		}
	})
}

// checkSubset checks that nodes are input hosts, in input order, each with a
// non-empty, strictly ascending list of valid slots.
func checkSubset(t *testing.T, hosts []Host, nodes []Node) {
	t.Helper()
	if len(nodes) == 0 {
		t.Fatal("Select succeeded with no nodes")
	}
	next := 0
	for _, n := range nodes {
		for next < len(hosts) && hosts[next] != n.Host {
			next++
		}
		if next == len(hosts) {
			t.Fatalf("node %+v is not an input host, or out of order", n.Host)
		}
		if len(n.SlotIDs) == 0 {
			t.Errorf("node %q has no slots", n.Name)
		}
		for i, id := range n.SlotIDs {
			if id < 0 || id >= n.Host.Slots || i > 0 && id <= n.SlotIDs[i-1] {
				t.Errorf("node %q: slots %v not ascending within [0, %d)", n.Name, n.SlotIDs, n.Host.Slots)
				break
			}
		}
		next++
	}
}
