package ckpt

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommitRefuses: Commit writes no manifest unless every listed file is
// there, of its size, and the shards tile every tensor exactly.
func TestCommitRefuses(t *testing.T) {
	t1 := func(name string, off int, n int) Tensor {
		data := make([]float32, n)
		return Tensor{Name: name, Shape: []int{6, 11}, Offset: off, Data: data}
	}
	layout2 := Layout{World: 2, DP: 2, TP: 1, PP: 1}
	cases := []struct {
		name   string
		ranks  [][]Tensor // what each rank writes
		edit   func(m *Manifest)
		reason string
	}{
		{"missing_file", [][]Tensor{{t1("w", 0, 30)}, {t1("w", 30, 36)}}, func(m *Manifest) {
			m.Layout = Layout{World: 3, DP: 3, TP: 1, PP: 1}
			m.Files = append(m.Files, File{Name: "rank-00002.safetensors", Rank: 2, Bytes: 100, SHA256: strings.Repeat("0", 64)})
		}, "rank-00002.safetensors: missing: every rank's WriteShard must return before Commit"},
		{"gap", [][]Tensor{{t1("w", 0, 10)}, {t1("w", 20, 46)}}, nil, `tensor "w" of shape [6 11]: no shard holds elements [10, 20)`},
		{"short", [][]Tensor{{t1("w", 0, 10)}, {t1("w", 10, 40)}}, nil, "no shard holds elements [50, 66)"},
		{"overlap", [][]Tensor{{t1("w", 0, 30)}, {t1("w", 29, 37)}}, nil, "shards overlap at element 29"},
		{"shapes_differ", [][]Tensor{{t1("w", 0, 33)}, {{Name: "w", Shape: []int{66}, Offset: 33, Data: make([]float32, 33)}}}, nil, `tensor "w": shape [66] here, [6 11] in rank-00000.safetensors`},
		{"wrong_size", [][]Tensor{{t1("w", 0, 30)}, {t1("w", 30, 36)}}, func(m *Manifest) { m.Files[1].Bytes++ }, "bytes, the manifest says"},
		{"wrong_rank", [][]Tensor{{t1("w", 0, 30)}, {t1("w", 30, 36)}}, func(m *Manifest) { m.Files[0].Rank, m.Files[1].Rank = 1, 0 }, "rank-00001.safetensors: holds step 7 of rank 1, listed as step 7 of rank 0"},
		{"layout", [][]Tensor{{t1("w", 0, 30)}, {t1("w", 30, 36)}}, func(m *Manifest) { m.Layout.TP = 2 }, "dp × tp × pp = 4, not world 2"},
		{"layout_world", [][]Tensor{{t1("w", 0, 30)}, {t1("w", 30, 36)}}, func(m *Manifest) { m.Layout = Layout{DP: 2} }, "world, dp, tp and pp must be at least 1"},
		{"rank_outside_world", [][]Tensor{{t1("w", 0, 30)}, {t1("w", 30, 36)}}, func(m *Manifest) { m.Layout = Layout{1, 1, 1, 1, 0} }, "rank 1 outside the world of 1"},
		{"job_not_json", [][]Tensor{{t1("w", 0, 30)}, {t1("w", 30, 36)}}, func(m *Manifest) { m.Job = json.RawMessage("{oops") }, "is the job spec valid JSON?"},
		{"no_files", nil, func(m *Manifest) {}, "no files"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			m := Manifest{Step: 7, Layout: layout2}
			for r, ts := range tc.ranks {
				f, err := WriteShard(root, 7, r, ts, nil)
				must(t, err)
				m.Files = append(m.Files, f)
			}
			if tc.edit != nil {
				tc.edit(&m)
			}
			err := Commit(root, m, 1, nil)
			if err == nil || !strings.HasPrefix(err.Error(), "ckpt: commit step-00000007: ") || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Commit = %v, want an error saying %q", err, tc.reason)
			}
			if _, err := os.Stat(filepath.Join(root, "step-00000007", ManifestName)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a refused commit left a manifest (%v)", err)
			}
		})
	}
}

// TestWriteShardRefuses: bad tensors are refused before anything is
// written.
func TestWriteShardRefuses(t *testing.T) {
	w := func(n int) Tensor { return Tensor{Name: "w", Shape: []int{2, 3}, Data: make([]float32, n)} }
	cases := []struct {
		name    string
		step    int64
		tensors []Tensor
		reason  string
	}{
		{"duplicate", 1, []Tensor{w(6), w(6)}, `tensor "w" given twice`},
		{"too_long", 1, []Tensor{w(7)}, "7 elements at offset 0 do not fit shape [2 3]"},
		{"past_end", 1, []Tensor{{Name: "w", Shape: []int{2, 3}, Offset: 4, Data: make([]float32, 3)}}, "3 elements at offset 4"},
		{"negative_offset", 1, []Tensor{{Name: "w", Shape: []int{2, 3}, Offset: -1, Data: make([]float32, 1)}}, "at offset -1"},
		{"negative_dim", 1, []Tensor{{Name: "w", Shape: []int{-2, 3}}}, "negative dimension"},
		{"reserved", 1, []Tensor{{Name: metadataKey}}, "empty or reserved"},
		{"unnamed", 1, []Tensor{{}}, "empty or reserved"},
		{"negative_step", -1, []Tensor{w(6)}, "must not be negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			_, err := WriteShard(root, tc.step, 0, tc.tensors, nil)
			if err == nil || !strings.HasPrefix(err.Error(), "ckpt: write step-") || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("WriteShard = %v, want an error saying %q", err, tc.reason)
			}
			if ents, _ := os.ReadDir(root); len(ents) != 0 {
				t.Errorf("a refused write left %d entries in the root", len(ents))
			}
		})
	}
}

// TestRewriteStep: a run resumed from an older checkpoint rewrites a later
// step; until it commits again, the old checkpoint of that step is gone
// rather than mixed with new files.
func TestRewriteStep(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, root, 100, 2, 0)
	mustWrite(t, root, 200, 2, 0)
	newer := fullTensors(999, 1)
	if _, err := WriteShard(root, 200, 0, shardOf(newer, 0, 2), nil); err != nil {
		t.Fatal(err)
	}
	var w warnings
	if c, err := Latest(t.Context(), root, w.warn); err != nil || c.Step() != 100 || !strings.Contains(w.String(), "step-00000200: no manifest.json") {
		t.Fatalf("during the rewrite: Latest = %v, %v, warnings %q; want step 100", c, err, &w)
	}
	mustWrite(t, root, 200, 2, 0)
	c, err := Latest(t.Context(), root, nil)
	if err != nil || c.Step() != 200 {
		t.Fatalf("after the rewrite: Latest = %v, %v", c, err)
	}
	if err := checkContent(c, 1); err != nil {
		t.Error(err)
	}
}

// TestTempFilesIgnored: what interrupted writes leave is never a
// checkpoint, and a commit clears it from its own directory.
func TestTempFilesIgnored(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, root, 1, 1, 0)
	for _, p := range []string{"step-00000002/.rank-00000.safetensors.tmp-123", "step-00000002/.manifest.json.tmp-9", "step-00000003.tmp-5/manifest.json", "step-3/manifest.json"} {
		must(t, os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755))
		must(t, os.WriteFile(filepath.Join(root, p), []byte("{}"), 0o644))
	}
	infos, err := List(t.Context(), root)
	if err != nil || len(infos) != 2 || !infos[0].Valid || infos[1].Valid || infos[1].Files != 0 {
		t.Fatalf("List = %+v, %v; want step 1 valid and step 2 invalid with no files", infos, err)
	}
	if c, err := Latest(t.Context(), root, nil); err != nil || c.Step() != 1 {
		t.Fatalf("Latest = %v, %v; want step 1", c, err)
	}
	must(t, os.WriteFile(filepath.Join(root, "step-00000001", ".rank-00000.safetensors.tmp-77"), nil, 0o644))
	mustWrite(t, root, 1, 1, 0)
	if ents, _ := os.ReadDir(filepath.Join(root, "step-00000001")); len(ents) != 2 {
		t.Errorf("after a commit, step 1 holds %d entries, want the rank file and the manifest", len(ents))
	}
}

// TestList describes valid and invalid step directories.
func TestList(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, root, 10, 2, 0)
	mustWrite(t, root, 20, 3, 0)
	flip(t, filepath.Join(root, "step-00000020", "rank-00001.safetensors"), -1)
	infos, err := List(t.Context(), root)
	if err != nil || len(infos) != 2 {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	a, b := infos[0], infos[1]
	if a.Step != 10 || !a.Valid || a.Files != 2 || a.Bytes < 600 || a.Created.IsZero() || a.Reason != "" {
		t.Errorf("step 10: %+v", a)
	}
	if b.Step != 20 || b.Valid || b.Files != 3 || b.Created.IsZero() || !strings.HasPrefix(b.Reason, "rank-00001.safetensors: sha256 mismatch") {
		t.Errorf("step 20: %+v", b)
	}
	if _, err := List(t.Context(), filepath.Join(root, "none")); err == nil {
		t.Error("List of a missing root: no error")
	}
	// A step directory copied under another name is still a checkpoint.
	best := filepath.Join(t.TempDir(), "best")
	must(t, os.Rename(filepath.Join(root, "step-00000010"), best))
	if info, err := Describe(t.Context(), best); err != nil || info.Step != 10 || !info.Valid {
		t.Errorf("Describe(best) = %+v, %v; want step 10, valid", info, err)
	}
	if info, err := Describe(t.Context(), t.TempDir()); err != nil || info.Step != -1 || info.Valid || !strings.HasPrefix(info.Reason, "no manifest.json") {
		t.Errorf("Describe(empty dir) = %+v, %v", info, err)
	}
}

// TestParseStepDir accepts only the canonical names.
func TestParseStepDir(t *testing.T) {
	for name, want := range map[string]int64{"step-00000000": 0, "step-00000100": 100, "step-123456789": 123456789} {
		if got, ok := ParseStepDir(name); !ok || got != want || StepDirName(got) != name {
			t.Errorf("ParseStepDir(%q) = %d, %v", name, got, ok)
		}
	}
	for _, name := range []string{"step-1", "step-", "step--0000001", "step-0000001x", "xstep-00000001", "step-00000100.tmp-1", "step-+0000100"} {
		if _, ok := ParseStepDir(name); ok {
			t.Errorf("ParseStepDir(%q) accepted", name)
		}
	}
}

// TestCommitLayoutDefaults: an unset degree is recorded as 1.
func TestCommitLayoutDefaults(t *testing.T) {
	root := t.TempDir()
	f, err := WriteShard(root, 3, 0, fullTensors(3, 1), nil)
	must(t, err)
	must(t, Commit(root, Manifest{Step: 3, Layout: Layout{World: 1}, Files: []File{f}}, 0, nil))
	c, err := Latest(t.Context(), root, nil)
	must(t, err)
	if want := (Layout{World: 1, DP: 1, TP: 1, PP: 1}); c.Manifest.Layout != want {
		t.Errorf("layout %+v, want %+v", c.Manifest.Layout, want)
	}
}
