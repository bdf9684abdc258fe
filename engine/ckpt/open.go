package ckpt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// ErrNoCheckpoint is the cause of Latest's error when no step directory
// under the root holds a valid checkpoint (or the root does not exist):
// the run starts from scratch.
var ErrNoCheckpoint = errors.New("ckpt: no valid checkpoint")

// maxManifestBytes bounds what is read of a manifest; a real one of a
// model with thousands of tensors and ranks is a few megabytes.
const maxManifestBytes = 256 << 20

// InvalidError says why a step directory is not a valid checkpoint: what
// is wrong with which of its files. Latest skips such a directory; Open and
// Verify return this error.
type InvalidError struct {
	Dir    string // the step directory
	File   string // the file at fault, e.g. "rank-00001.safetensors"; "" for the directory
	Reason string // what is wrong, e.g. "sha256 mismatch: ..."
	Err    error  // the underlying error, if any
}

// Error is "ckpt: verify step-00000100/rank-00000.safetensors: reason".
func (e *InvalidError) Error() string { return "ckpt: verify " + e.Target() + ": " + e.Reason }

// Unwrap returns the underlying error.
func (e *InvalidError) Unwrap() error { return e.Err }

// Target names the step directory, and the file at fault if there is one.
func (e *InvalidError) Target() string {
	if e.File == "" {
		return filepath.Base(e.Dir)
	}
	return filepath.Base(e.Dir) + "/" + e.File
}

// Problem is the file at fault and the reason, e.g.
// "rank-00000.safetensors: missing".
func (e *InvalidError) Problem() string {
	if e.File == "" {
		return e.Reason
	}
	return e.File + ": " + e.Reason
}

func invalid(dir, file string, err error, format string, a ...any) *InvalidError {
	return &InvalidError{Dir: dir, File: file, Reason: fmt.Sprintf(format, a...), Err: err}
}

// Open returns the checkpoint in the step directory dir after verifying it
// fully: the manifest, the size and SHA-256 of every file, and that the
// files' headers hold exactly the tensors the manifest lists. A directory
// that is not a valid checkpoint gives an *InvalidError; a file that cannot
// be read (permissions, I/O) another error. Once ctx ends, Open stops
// within a MiB of reading and returns an error wrapping ctx's cause.
func Open(ctx context.Context, dir string) (*Checkpoint, error) {
	if err := stopped(ctx, "verify", dir); err != nil {
		return nil, err
	}
	m, err := readManifest(dir)
	if err != nil {
		return nil, err
	}
	for _, f := range m.Files {
		if err := verifyFile(ctx, dir, f); err != nil {
			return nil, err
		}
	}
	if err := stopped(ctx, "verify", dir); err != nil {
		return nil, err
	}
	idx, headers, err := buildIndex(dir, m.Step, m.Files)
	if err != nil {
		return nil, err
	}
	if err := sameIndex(m.Tensors, idx); err != nil {
		return nil, invalid(dir, ManifestName, nil, "does not match the files: %v", err)
	}
	return &Checkpoint{Dir: dir, Manifest: *m, headers: headers}, nil
}

// Verify checks the checkpoint in the step directory dir as Open does.
func Verify(ctx context.Context, dir string) error {
	_, err := Open(ctx, dir)
	return err
}

// readManifest reads and checks dir's manifest, without the files.
func readManifest(dir string) (*Manifest, error) {
	f, err := os.Open(filepath.Join(dir, ManifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, invalid(dir, "", err, "no %s: never committed (its write was interrupted, or is still going on)", ManifestName)
	}
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("ckpt: read %s: %w", f.Name(), err)
	}
	if len(b) > maxManifestBytes {
		return nil, invalid(dir, ManifestName, nil, "larger than %d bytes", maxManifestBytes)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, invalid(dir, ManifestName, err, "not valid JSON: %v", err)
	}
	if err := m.validate(); err != nil {
		return nil, invalid(dir, ManifestName, err, "%v", err)
	}
	// A copied step directory may be renamed; a canonical name must agree.
	if step, ok := ParseStepDir(filepath.Base(dir)); ok && step != m.Step {
		return nil, invalid(dir, ManifestName, nil, "says step %d, in the directory of step %d", m.Step, step)
	}
	return &m, nil
}

// verifyFile checks the size and SHA-256 of one file, reading it once, a
// MiB at a time until ctx ends.
func verifyFile(ctx context.Context, dir string, want File) error {
	f, err := os.Open(filepath.Join(dir, want.Name))
	if errors.Is(err, fs.ErrNotExist) {
		return invalid(dir, want.Name, err, "missing (the manifest lists it)")
	}
	if err != nil {
		return fmt.Errorf("ckpt: verify: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("ckpt: verify: %w", err)
	}
	if st.Size() != want.Bytes {
		return invalid(dir, want.Name, nil, "%d bytes, the manifest says %d (truncated, or replaced after the commit)", st.Size(), want.Bytes)
	}
	h := sha256.New()
	if _, err := io.CopyBuffer(h, ctxReader{ctx, io.LimitReader(f, want.Bytes)}, make([]byte, 1<<20)); err != nil {
		return fmt.Errorf("ckpt: verify %s: %w", f.Name(), err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want.SHA256 {
		return invalid(dir, want.Name, nil, "sha256 mismatch: %s, the manifest says %s (the file changed after it was written: disk or copy corruption)", got[:16]+"…", want.SHA256[:16]+"…")
	}
	return nil
}

// sameIndex reports the first difference between two sorted tensor
// indexes.
func sameIndex(a, b []TensorIndex) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d tensors listed, the files hold %d", len(a), len(b))
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Name != y.Name || x.DType != y.DType || !slices.Equal(x.Shape, y.Shape) || !slices.Equal(x.Shards, y.Shards) {
			return fmt.Errorf("tensor %q is listed as %s %v in %d shard(s); the files hold %q %s %v in %d", x.Name, x.DType, x.Shape, len(x.Shards), y.Name, y.DType, y.Shape, len(y.Shards))
		}
	}
	return nil
}

// Latest returns the newest valid checkpoint under root. Every newer step
// directory that is not a valid checkpoint is skipped, and warn (if not nil)
// is told which and why ("ckpt: skipping step-00000200: ..."). With no valid
// checkpoint, or no root, the error wraps ErrNoCheckpoint. A file that
// cannot be read at all (permissions, I/O errors) stops the search with its
// error, rather than silently falling back to an older checkpoint; so does
// the end of ctx, with an error wrapping its cause.
//
// A running job may commit a newer step and prune the one being verified
// while Latest reads (gtrain resume --dry-run, ckpt ls beside the job):
// when no step was valid but the step directories changed meanwhile, it
// looks again, a few times at most.
func Latest(ctx context.Context, root string, warn func(string)) (*Checkpoint, error) {
	if err := stopped(ctx, "find the latest checkpoint in", root); err != nil {
		return nil, err
	}
	steps, err := stepDirs(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s: the directory does not exist", ErrNoCheckpoint, root)
	}
	for pass := 1; err == nil; pass++ {
		c, ok, lerr := latestOf(ctx, root, steps, warn)
		if ok || lerr != nil {
			return c, lerr
		}
		if pass == maxLatestPasses {
			break
		}
		var now []stepDir
		if now, err = stepDirs(root); err == nil && slices.Equal(now, steps) {
			break
		}
		steps = now
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("%w in %s: no step directories", ErrNoCheckpoint, root)
	}
	if len(steps) == 1 {
		return nil, fmt.Errorf("%w in %s: its one step directory is not valid", ErrNoCheckpoint, root)
	}
	return nil, fmt.Errorf("%w in %s: none of its %d step directories is valid", ErrNoCheckpoint, root, len(steps))
}

// maxLatestPasses bounds Latest's looks at a directory that keeps changing.
const maxLatestPasses = 3

// latestOf is the newest valid checkpoint of steps (ok), skipping invalid
// ones with a warning; err is set when a step could not be read at all or
// ctx ended, and neither is set when none is valid.
func latestOf(ctx context.Context, root string, steps []stepDir, warn func(string)) (c *Checkpoint, ok bool, err error) {
	for i := len(steps) - 1; i >= 0; i-- {
		c, err := Open(ctx, steps[i].path)
		var inv *InvalidError
		switch {
		case ctx.Err() != nil: // not invalid: cut short
			return nil, false, stopped(ctx, "find the latest checkpoint in", root)
		case errors.As(err, &inv):
			if warn != nil {
				warn("ckpt: skipping " + filepath.Base(steps[i].path) + ": " + inv.Problem())
			}
			continue
		}
		return c, err == nil, err
	}
	return nil, false, nil
}

// stepDir is a step directory under a root.
type stepDir struct {
	step int64
	path string
}

// stepDirs lists the step directories of root in step order.
func stepDirs(root string) ([]stepDir, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	var out []stepDir
	for _, e := range ents {
		if step, ok := ParseStepDir(e.Name()); ok && e.IsDir() {
			out = append(out, stepDir{step, filepath.Join(root, e.Name())})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].step < out[j].step })
	return out, nil
}

// Info describes one step directory, for List and Describe.
type Info struct {
	Step    int64     `json:"step"`
	Dir     string    `json:"dir"`
	Created time.Time `json:"created,omitzero"` // from the manifest; zero without one
	Bytes   int64     `json:"bytes"`            // size of its files: those of the manifest, else all but temporary ones
	Files   int       `json:"files"`            // number of those files
	Valid   bool      `json:"valid"`
	Reason  string    `json:"reason,omitempty"` // why it is not valid
}

// List describes every step directory under root, oldest first, as
// Describe does. It fails only when root cannot be read, or ctx ends.
func List(ctx context.Context, root string) ([]Info, error) {
	if err := stopped(ctx, "list", root); err != nil {
		return nil, err
	}
	steps, err := stepDirs(root)
	if err != nil {
		return nil, err
	}
	infos := make([]Info, 0, len(steps))
	for _, s := range steps {
		info, err := Describe(ctx, s.path)
		if err != nil {
			return nil, err
		}
		infos = append(infos, info)
	}
	return infos, nil
}

// Describe verifies the step directory dir fully, as Open does, and
// describes it: Valid is true exactly when Open (and so Latest) would load
// it. Step is that of the directory's name, or of its manifest when the
// name is not a step directory's (-1 without either). Every problem of the
// directory is in the Info; the error is only that ctx ended (wrapping its
// cause), when the verification was cut short.
func Describe(ctx context.Context, dir string) (Info, error) {
	if err := stopped(ctx, "verify", dir); err != nil {
		return Info{}, err
	}
	info := Info{Step: -1, Dir: dir}
	info.Files, info.Bytes = dirFiles(dir)
	if m, err := readManifest(dir); err == nil {
		info.Step, info.Created = m.Step, m.Created
	}
	if step, ok := ParseStepDir(filepath.Base(dir)); ok {
		info.Step = step
	}
	c, err := Open(ctx, dir)
	if err := stopped(ctx, "verify", dir); err != nil {
		return Info{}, err
	}
	var inv *InvalidError
	switch {
	case errors.As(err, &inv):
		info.Reason = inv.Problem()
	case err != nil:
		info.Reason = err.Error()
	default:
		info.Valid = true
		info.Files, info.Bytes = len(c.Manifest.Files), c.Manifest.Bytes()
	}
	return info, nil
}

// dirFiles counts the files in dir and their bytes, leaving out the
// manifest and temporary files.
func dirFiles(dir string) (n int, bytes int64) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !e.Type().IsRegular() || isTemp(e.Name()) || e.Name() == ManifestName {
			continue
		}
		if fi, err := e.Info(); err == nil {
			n++
			bytes += fi.Size()
		}
	}
	return n, bytes
}
