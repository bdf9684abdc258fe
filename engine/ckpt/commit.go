package ckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"
)

// Commit makes step m.Step under root a checkpoint, once every rank's
// WriteShard has returned: m carries the job spec (Job), the Layout (a DP,
// TP or PP of 0 counts as 1) and every rank's File. Commit checks that each file is there with its size,
// builds the tensor index (m.Tensors) from the files' headers, checks that
// the shards tile every tensor exactly, and writes manifest.json last and
// atomically (temp file, fsync, rename, fsync of the step directory and of
// root). Then, if keep > 0, it deletes older step directories: checkpoints
// beyond the newest keep (counting this one) and directories without a
// complete checkpoint. It never touches this step or newer ones. Failures to
// delete are passed to warn (if not nil): the checkpoint is committed.
func Commit(root string, m Manifest, keep int, warn func(string)) error {
	name := StepDirName(m.Step)
	if m.Step < 0 {
		return fmt.Errorf("ckpt: commit: negative step %d", m.Step)
	}
	dir := filepath.Join(root, name)
	if err := prepareManifest(dir, &m); err != nil {
		return fmt.Errorf("ckpt: commit %s: %w", name, err)
	}
	js, err := json.MarshalIndent(&m, "", "  ")
	if err != nil {
		return fmt.Errorf("ckpt: commit %s: encode manifest (is the job spec valid JSON?): %w", name, err)
	}
	err = writeAtomic(filepath.Join(dir, ManifestName), func(f io.Writer) error {
		_, err := f.Write(append(js, '\n'))
		return err
	})
	if err == nil {
		// The step directory's own entry must be durable before older
		// checkpoints are deleted.
		err = syncDir(root)
	}
	if err != nil {
		return fmt.Errorf("ckpt: commit %s: %w", name, err)
	}
	if warn == nil {
		warn = func(string) {}
	}
	removeTemps(dir, warn)
	prune(root, m.Step, keep, warn)
	return nil
}

// prepareManifest completes m from the files in dir and checks it.
func prepareManifest(dir string, m *Manifest) error {
	m.Format = Format
	if m.Created.IsZero() {
		m.Created = time.Now().UTC()
	}
	// An unset degree (0) is 1: a job spec may leave tp or pp out.
	for _, d := range []*int{&m.Layout.DP, &m.Layout.TP, &m.Layout.PP} {
		if *d == 0 {
			*d = 1
		}
	}
	m.Files = slices.Clone(m.Files)
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Rank < m.Files[j].Rank })
	if err := m.Layout.validate(); err != nil {
		return err
	}
	if err := validateFiles(m.Files, m.Layout.World); err != nil {
		return err
	}
	idx, _, err := buildIndex(dir, m.Step, m.Files)
	var inv *InvalidError
	if errors.As(err, &inv) {
		if errors.Is(inv.Err, fs.ErrNotExist) {
			return fmt.Errorf("%s: missing: every rank's WriteShard must return before Commit", inv.File)
		}
		return errors.New(inv.Problem())
	}
	if err != nil {
		return err
	}
	m.Tensors = idx
	return m.validate()
}

// buildIndex reads the header of every file and returns the tensor index
// they make, sorted by name with shards by offset, and the headers by file
// name. Problems with a file are *InvalidErrors.
func buildIndex(dir string, step int64, files []File) ([]TensorIndex, map[string]*Header, error) {
	byName := map[string]*TensorIndex{}
	headers := make(map[string]*Header, len(files))
	for _, f := range files {
		h, err := readFileHeader(dir, f)
		if err != nil {
			return nil, nil, err
		}
		if err := indexFile(byName, h, step, f); err != nil {
			return nil, nil, invalid(dir, f.Name, err, "%v", err)
		}
		headers[f.Name] = h
	}
	idx := make([]TensorIndex, 0, len(byName))
	for _, t := range byName {
		sortShards(t.Shards)
		idx = append(idx, *t)
	}
	sort.Slice(idx, func(i, j int) bool { return idx[i].Name < idx[j].Name })
	return idx, headers, nil
}

// readFileHeader reads the safetensors header of one file of dir, checking
// its size first.
func readFileHeader(dir string, f File) (*Header, error) {
	fh, err := os.Open(filepath.Join(dir, f.Name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, invalid(dir, f.Name, err, "missing (the manifest lists it)")
	}
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	if st.Size() != f.Bytes {
		return nil, invalid(dir, f.Name, nil, "%d bytes, the manifest says %d (truncated, or replaced after it was written)", st.Size(), f.Bytes)
	}
	h, err := ReadHeader(fh, st.Size())
	if err != nil {
		return nil, invalid(dir, f.Name, err, "%v", err)
	}
	return h, nil
}

// indexFile adds the shards of one rank file to the index.
func indexFile(byName map[string]*TensorIndex, h *Header, step int64, f File) error {
	rm, err := readRankMeta(h)
	if err != nil {
		return err
	}
	if rm.step != step || rm.rank != f.Rank {
		return fmt.Errorf("holds step %d of rank %d, listed as step %d of rank %d", rm.step, rm.rank, step, f.Rank)
	}
	parts, err := readPartsMeta(h, rm)
	if err != nil {
		return err
	}
	for _, e := range h.Entries {
		sm, ok := rm.shards[e.Name]
		switch {
		case !ok:
			return fmt.Errorf("tensor %q: not in metadata %s", e.Name, metaShards)
		case e.DType != "F32":
			return fmt.Errorf("tensor %q: dtype %s, want F32", e.Name, e.DType)
		}
		t := byName[e.Name]
		if t == nil {
			t = &TensorIndex{Name: e.Name, Shape: sm.Shape, DType: "F32"}
			byName[e.Name] = t
		} else if !slices.Equal(t.Shape, sm.Shape) {
			return fmt.Errorf("tensor %q: shape %v here, %v in %s", e.Name, sm.Shape, t.Shape, t.Shards[0].File)
		}
		t.Shards = append(t.Shards, ShardRef{File: f.Name, Offset: sm.Offset, Len: e.Numel(), Part: parts[e.Name]})
	}
	return nil
}

// removeTemps deletes what interrupted writes left in dir.
func removeTemps(dir string, warn func(string)) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if isTemp(e.Name()) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				warn(fmt.Sprintf("ckpt: remove leftover %s: %v", e.Name(), err))
			}
		}
	}
}

// prune deletes the step directories older than newest beyond the newest
// keep complete checkpoints (newest included), and every older directory
// that holds no complete checkpoint. Complete means a valid manifest and
// files of the listed sizes; checksums are not read here (Latest does).
func prune(root string, newest int64, keep int, warn func(string)) {
	if keep <= 0 {
		return
	}
	steps, err := stepDirs(root)
	if err != nil {
		warn(fmt.Sprintf("ckpt: prune: %v", err))
		return
	}
	kept := 1 // the checkpoint just committed
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		if s.step >= newest {
			continue
		}
		if kept < keep && complete(s.path) {
			kept++
			continue
		}
		if err := removeStep(s.path); err != nil {
			warn(fmt.Sprintf("ckpt: prune %s: %v", filepath.Base(s.path), err))
		}
	}
}

// complete reports whether dir has a valid manifest and every file it
// lists, of the listed size.
func complete(dir string) bool {
	m, err := readManifest(dir)
	if err != nil {
		return false
	}
	for _, f := range m.Files {
		st, err := os.Stat(filepath.Join(dir, f.Name))
		if err != nil || st.Size() != f.Bytes {
			return false
		}
	}
	return true
}

// removeStep deletes a step directory, its manifest first: interrupted
// half-way, what is left is plainly no checkpoint.
func removeStep(dir string) error {
	if err := removeIfExists(filepath.Join(dir, ManifestName)); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
