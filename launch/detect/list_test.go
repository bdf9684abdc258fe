package detect

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		err  string
	}{
		{"", []int{}, ""},
		{"0\n", []int{0}, ""},
		{"0-3,8-11", []int{0, 1, 2, 3, 8, 9, 10, 11}, ""},
		{"0-7:2", []int{0, 2, 4, 6}, ""},
		{"5,1", []int{5, 1}, ""},
		{"3-1", nil, "runs backwards"},
		{"0-x", nil, `id "x"`},
		{"-1", nil, `id ""`},
		{"0,,1", nil, `id ""`},
		{"0-65537", nil, "want 0-65536"},
		{"0-65536,0", nil, "more than 65536 ids"},
		{"0-3:0", nil, "stride"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseList(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseList(%q) = %v, %v: want an error with %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("ParseList(%q) = %v, %v: want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

// FuzzParseList: any input gives ids within bounds, at most MaxCPU of
// them, or an error; never a panic or an unbounded list.
func FuzzParseList(f *testing.F) {
	for _, s := range []string{"0-3,8-11", "0", "", "1-0", "0-65536:3", "4294967296", "0-9:", ",", "7-7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := ParseList(s)
		if err != nil {
			return
		}
		if len(ids) > MaxCPU {
			t.Fatalf("%d ids from %q", len(ids), s)
		}
		for _, id := range ids {
			if id < 0 || id > MaxCPU {
				t.Fatalf("id %d from %q", id, s)
			}
		}
	})
}

// TestReadBounded: a file larger than fileLimit is read only up to it, and
// a missing file is unknown, not an error.
func TestReadBounded(t *testing.T) {
	root := t.TempDir()
	big := strings.Repeat("9", 4*fileLimit)
	if err := os.WriteFile(filepath.Join(root, "big"), []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	f := fsys{root: root}
	if s, ok := f.read("big"); !ok || len(s) != fileLimit {
		t.Errorf("read big: %d bytes, %v: want %d", len(s), ok, fileLimit)
	}
	if _, ok := f.read("missing"); ok {
		t.Error("read missing: ok")
	}
	if n := f.numa(f.cpus()); len(n) != 1 || n[0].ID != 0 {
		t.Errorf("numa of an empty tree = %+v: want one node 0", n)
	}
}

func TestCPUMax(t *testing.T) {
	for in, want := range map[string]float64{"max 100000": 0, "150000 100000": 1.5, "": 0, "x 1": 0, "100 0": 0, "-5 100": 0} {
		if got := cpuMax(in); got != want {
			t.Errorf("cpuMax(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestFormatList: FormatList writes what ParseList reads back.
func TestFormatList(t *testing.T) {
	for in, want := range map[string]string{"0-3,8-11": "0-3,8-11", "0,2,4": "0,2,4", "": "", "5,6,1": "5-6,1", "0-7:2": "0,2,4,6"} {
		ids, err := ParseList(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := FormatList(ids); got != want {
			t.Errorf("FormatList(%v) = %q, want %q", ids, got, want)
		}
		if back, _ := ParseList(FormatList(ids)); !slices.Equal(back, ids) {
			t.Errorf("ParseList(FormatList(%v)) = %v", ids, back)
		}
	}
}
