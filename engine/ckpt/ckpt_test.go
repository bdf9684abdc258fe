package ckpt

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRoundTrip writes a checkpoint from one rank and from three ranks each
// holding an uneven slice of every tensor, and reads it back whole and per
// rank.
func TestRoundTrip(t *testing.T) {
	for _, world := range []int{1, 3} {
		t.Run(map[int]string{1: "one_rank", 3: "three_ranks"}[world], func(t *testing.T) {
			root := t.TempDir()
			mustWrite(t, root, 100, world, 0)
			var w warnings
			c, err := Latest(t.Context(), root, w.warn)
			if err != nil || w.String() != "" {
				t.Fatalf("Latest: %v; warnings: %s", err, &w)
			}
			if c.Step() != 100 || c.Dir != filepath.Join(root, "step-00000100") {
				t.Errorf("Latest: step %d in %s, want 100 in step-00000100", c.Step(), c.Dir)
			}
			// A Checkpoint is read by several goroutines at once.
			errs := make(chan error, 2)
			for range 2 {
				go func() { errs <- checkContent(c, 1) }()
			}
			for range 2 {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
			checkManifest(t, c.Manifest, world)
			full := fullTensors(100, 1)
			for r := range world {
				got, _, err := c.Shard(r)
				if err != nil {
					t.Fatal(err)
				}
				want := shardOf(full, r, world)
				for k := range want {
					if got[k].Name != want[k].Name || !slices.Equal(got[k].Shape, want[k].Shape) ||
						got[k].Offset != want[k].Offset || !slices.Equal(got[k].Data, want[k].Data) {
						t.Errorf("rank %d: Shard tensor %d = %s %v @%d (%d elements), want %s %v @%d (%d)", r, k,
							got[k].Name, got[k].Shape, got[k].Offset, len(got[k].Data), want[k].Name, want[k].Shape, want[k].Offset, len(want[k].Data))
					}
				}
			}
			if _, _, err := c.Shard(world); err == nil || !strings.Contains(err.Error(), "no file of rank") {
				t.Errorf("Shard(%d) = %v, want no file of rank", world, err)
			}
			if _, _, err := c.Tensor("no.such.tensor"); err == nil {
				t.Error("Tensor(no.such.tensor): no error")
			}
		})
	}
}

// checkManifest checks what Commit filled in.
func checkManifest(t *testing.T, m Manifest, world int) {
	t.Helper()
	var job bytes.Buffer
	must(t, json.Compact(&job, m.Job))
	if m.Format != Format || m.Created.IsZero() || job.String() != string(testJob) || m.Layout.World != world || len(m.Files) != world {
		t.Errorf("manifest: format %d, created %v, job %s, layout %+v, %d files", m.Format, m.Created, m.Job, m.Layout, len(m.Files))
	}
	if len(m.Tensors) != len(testShapes) || !slices.IsSortedFunc(m.Tensors, func(a, b TensorIndex) int { return strings.Compare(a.Name, b.Name) }) {
		t.Errorf("manifest: %d tensors, want %d sorted by name", len(m.Tensors), len(testShapes))
	}
	for _, ti := range m.Tensors {
		if ti.DType != "F32" || len(ti.Shards) != world {
			t.Errorf("manifest: tensor %s: %s in %d shards, want F32 in %d", ti.Name, ti.DType, len(ti.Shards), world)
		}
	}
}

// TestWholeTensorKeepsShape: a tensor a rank holds whole is stored with its
// full shape, a shard 1-D.
func TestWholeTensorKeepsShape(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, root, 1, 3, 0)
	// wte's 66 elements split 7/22/37; the scalar is rank 2's alone.
	h := headerOf(t, filepath.Join(root, "step-00000001", "rank-00002.safetensors"))
	if e, _ := h.Entry("transformer.wte.weight"); !slices.Equal(e.Shape, []int{37}) {
		t.Errorf("rank 2's shard of wte: shape %v, want [37]", e.Shape)
	}
	if e, _ := h.Entry("optimizer.step"); !slices.Equal(e.Shape, []int{}) {
		t.Errorf("rank 2's whole scalar: shape %v, want []", e.Shape)
	}
	mustWrite(t, root, 2, 1, 0)
	h = headerOf(t, filepath.Join(root, "step-00000002", "rank-00000.safetensors"))
	if e, _ := h.Entry("transformer.wte.weight"); !slices.Equal(e.Shape, []int{11, 6}) {
		t.Errorf("one rank's wte: shape %v, want [11 6]", e.Shape)
	}
	if h.Metadata[metaState] != string(stateOf(2, 0)) {
		t.Errorf("state in metadata: %q", h.Metadata[metaState])
	}
}

func headerOf(t *testing.T, path string) *Header {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	h, err := ReadHeader(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestStateBytes: any state bytes come back as they were, UTF-8 or not.
func TestStateBytes(t *testing.T) {
	root := t.TempDir()
	for i, state := range [][]byte{nil, []byte("plain"), {0xff, 0, 0xfe, 'x'}} {
		step := int64(i)
		f, err := WriteShard(root, step, 0, fullTensors(step, 1)[:1], state)
		if err != nil {
			t.Fatal(err)
		}
		if err := Commit(root, Manifest{Step: step, Layout: Layout{1, 1, 1, 1, 0}, Files: []File{f}}, 0, nil); err != nil {
			t.Fatal(err)
		}
		c, err := Open(t.Context(), filepath.Join(root, StepDirName(step)))
		if err != nil {
			t.Fatal(err)
		}
		if _, got, err := c.Shard(0); err != nil || string(got) != string(state) {
			t.Errorf("state %q: got %q, %v", state, got, err)
		}
	}
}

// corruptions each damage step 200 of a root that also holds a valid step
// 100; reason is what the warning must say.
var corruptions = []struct {
	name, file, reason string
	damage             func(t *testing.T, dir string)
}{
	{"no_manifest", "", "no manifest.json", func(t *testing.T, dir string) { rm(t, dir, ManifestName) }},
	{"truncated", "rank-00001.safetensors", "bytes, the manifest says", func(t *testing.T, dir string) {
		must(t, os.Truncate(filepath.Join(dir, "rank-00001.safetensors"), 100))
	}},
	{"flipped_data_byte", "rank-00002.safetensors", "sha256 mismatch", func(t *testing.T, dir string) { flip(t, filepath.Join(dir, "rank-00002.safetensors"), -5) }},
	{"flipped_header_byte", "rank-00000.safetensors", "sha256 mismatch", func(t *testing.T, dir string) { flip(t, filepath.Join(dir, "rank-00000.safetensors"), 20) }},
	{"missing_file", "rank-00000.safetensors", "missing", func(t *testing.T, dir string) { rm(t, dir, "rank-00000.safetensors") }},
	{"manifest_not_json", ManifestName, "not valid JSON", func(t *testing.T, dir string) {
		must(t, os.WriteFile(filepath.Join(dir, ManifestName), []byte(`{"format":1,`), 0o644))
	}},
	{"manifest_escapes_dir", ManifestName, "want a plain file name", func(t *testing.T, dir string) {
		editManifest(t, dir, func(m *Manifest) { m.Files[0].Name = "../step-00000100/rank-00000.safetensors" })
	}},
	{"manifest_other_format", ManifestName, "format 2", func(t *testing.T, dir string) { editManifest(t, dir, func(m *Manifest) { m.Format = 2 }) }},
	{"manifest_wrong_shape", ManifestName, "does not match the files", func(t *testing.T, dir string) {
		editManifest(t, dir, func(m *Manifest) { m.Tensors[0].Shape = []int{6, 11} })
	}},
	{"manifest_gap", ManifestName, "no shard holds elements", func(t *testing.T, dir string) {
		editManifest(t, dir, func(m *Manifest) { m.Tensors[1].Shards[2].Offset++; m.Tensors[1].Shards[2].Len-- })
	}},
	{"manifest_wrong_step", ManifestName, "says step 300", func(t *testing.T, dir string) { editManifest(t, dir, func(m *Manifest) { m.Step = 300 }) }},
}

// TestLatestSkipsInvalid: a damaged newest checkpoint is skipped with a
// warning naming the step and the reason, and the previous one returned;
// Verify and Open name the file.
func TestLatestSkipsInvalid(t *testing.T) {
	for _, tc := range corruptions {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			mustWrite(t, root, 100, 3, 0)
			mustWrite(t, root, 200, 3, 0)
			dir := filepath.Join(root, "step-00000200")
			tc.damage(t, dir)
			var w warnings
			c, err := Latest(t.Context(), root, w.warn)
			if err != nil || c.Step() != 100 {
				t.Fatalf("Latest = %v, %v; want step 100", c, err)
			}
			if err := checkContent(c, 1); err != nil {
				t.Error(err)
			}
			want := "ckpt: skipping step-00000200: "
			if tc.file != "" {
				want += tc.file + ": "
			}
			if !strings.HasPrefix(w.String(), want) || !strings.Contains(w.String(), tc.reason) || len(w.msgs) != 1 {
				t.Errorf("warnings:\n%s\nwant one starting %q and saying %q", &w, want, tc.reason)
			}
			err = Verify(t.Context(), dir)
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.File != tc.file || !strings.HasPrefix(err.Error(), "ckpt: verify step-00000200") || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Verify = %v, want an *InvalidError naming %q and saying %q", err, tc.file, tc.reason)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func rm(t *testing.T, dir, name string) { t.Helper(); must(t, os.Remove(filepath.Join(dir, name))) }

// flip inverts the byte at off (from the end when negative).
func flip(t *testing.T, path string, off int) {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	if off < 0 {
		off += len(b)
	}
	b[off] ^= 0x10
	must(t, os.WriteFile(path, b, 0o644))
}

func editManifest(t *testing.T, dir string, edit func(*Manifest)) {
	t.Helper()
	path := filepath.Join(dir, ManifestName)
	b, err := os.ReadFile(path)
	must(t, err)
	var m Manifest
	must(t, json.Unmarshal(b, &m))
	edit(&m)
	b, err = json.Marshal(&m)
	must(t, err)
	must(t, os.WriteFile(path, b, 0o644))
}

// TestLatestNone: no root, an empty root, or only invalid checkpoints give
// ErrNoCheckpoint.
func TestLatestNone(t *testing.T) {
	root := t.TempDir()
	invalidOnly := filepath.Join(root, "invalid")
	mustWrite(t, invalidOnly, 5, 1, 0)
	rm(t, filepath.Join(invalidOnly, "step-00000005"), ManifestName)
	must(t, os.Mkdir(filepath.Join(root, "empty"), 0o755))
	for _, r := range []string{filepath.Join(root, "nothing"), filepath.Join(root, "empty"), invalidOnly} {
		if c, err := Latest(t.Context(), r, nil); !errors.Is(err, ErrNoCheckpoint) || c != nil {
			t.Errorf("Latest(%s) = %v, %v; want ErrNoCheckpoint", filepath.Base(r), c, err)
		}
	}
}

// stepsIn lists the step directories of root.
func stepsIn(t *testing.T, root string) []int64 {
	t.Helper()
	steps, err := stepDirs(root)
	must(t, err)
	var out []int64
	for _, s := range steps {
		out = append(out, s.step)
	}
	return out
}

// TestKeepPruning: Commit keeps the newest K checkpoints, deletes older
// incomplete step directories, and never touches newer ones.
func TestKeepPruning(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, root, 1, 2, 2)
	mustWrite(t, root, 2, 2, 2)
	if _, err := WriteShard(root, 3, 0, fullTensors(3, 1), nil); err != nil { // never committed
		t.Fatal(err)
	}
	mustWrite(t, root, 4, 2, 2)
	if got := stepsIn(t, root); !slices.Equal(got, []int64{2, 4}) {
		t.Errorf("after step 4 with keep 2: steps %v, want [2 4]", got)
	}
	if _, err := WriteShard(root, 9, 0, fullTensors(9, 1), nil); err != nil { // newer, not ours to delete
		t.Fatal(err)
	}
	mustWrite(t, root, 5, 2, 2)
	if got := stepsIn(t, root); !slices.Equal(got, []int64{4, 5, 9}) {
		t.Errorf("after step 5 with keep 2: steps %v, want [4 5 9]", got)
	}
	var w warnings
	if c, err := Latest(t.Context(), root, w.warn); err != nil || c.Step() != 5 || !strings.Contains(w.String(), "skipping step-00000009: no manifest.json") {
		t.Errorf("Latest = %v, %v, warnings %q; want 5, skipping 9", c, err, &w)
	}
	mustWrite(t, root, 6, 1, 0)
	mustWrite(t, root, 7, 1, 1)
	if got := stepsIn(t, root); !slices.Equal(got, []int64{7, 9}) {
		t.Errorf("after step 7 with keep 1: steps %v, want [7 9]", got)
	}
}
