package train

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/internal/usage"
)

// ResolveIn prepares spec for its ranks: resolved (Spec.Resolved), with an
// absolute checkpoint directory (spec's own, relative to dir; when the spec
// names none, a new run directory that newRun picks in dir/runs), and
// encoded as JSON, the form the launcher hands every rank. A nil newRun is
// FreshRunDir at the present time. Both the launcher and a rank started by
// hand (`gtrain worker`) prepare a spec this way.
func ResolveIn(spec Spec, dir string, newRun func(runs string) (string, error)) (Spec, string, error) {
	if newRun == nil {
		now := time.Now()
		newRun = func(runs string) (string, error) { return FreshRunDir(runs, now) }
	}
	spec, err := spec.Resolved()
	if err != nil {
		return spec, "", &usage.Error{Err: err}
	}
	ck := spec.Checkpoint.Dir
	if ck == "" {
		if ck, err = newRun(filepath.Join(dir, "runs")); err != nil {
			return spec, "", err
		}
	} else if !filepath.IsAbs(ck) {
		ck = filepath.Join(dir, ck)
	}
	spec.Checkpoint.Dir = filepath.Clean(ck)
	if tb := spec.Log.TensorBoard; tb != "" && !filepath.IsAbs(tb) {
		spec.Log.TensorBoard = filepath.Join(dir, tb)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return spec, "", fmt.Errorf("job: encode: %w", err)
	}
	return spec, string(b), nil
}

// runDirName is the name of a new run's directory: its start time.
func runDirName(now time.Time) string { return now.Format("20060102-150405") }

// FreshRunDir creates root/<YYYYmmdd-HHMMSS>, or with a suffix (-2, -3,
// ...) when that exists, and returns it. The directory is made with
// os.Mkdir, which fails on an existing one: two runs started in the same
// second never share a directory.
func FreshRunDir(root string, now time.Time) (string, error) {
	dir, err := ckpt.MkdirUnique(root, runDirName(now))
	if err != nil {
		return "", fmt.Errorf("run: new run directory in %s: %w", root, err)
	}
	return dir, nil
}

// NextRunDir is the directory FreshRunDir would create now, for a dry run,
// which creates nothing.
func NextRunDir(root string, now time.Time) (string, error) {
	base := filepath.Join(root, runDirName(now))
	dir := base
	for i := 2; i < 10000; i++ {
		if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
			return dir, nil
		}
		dir = fmt.Sprintf("%s-%d", base, i)
	}
	return "", fmt.Errorf("run: %s: too many run directories of that name", base)
}

// RemoteRunDir names a new run's directory on hosts this machine cannot
// see (a hostfile job): its start time and a random suffix, since no
// os.Mkdir here can make the name unique there. Rank 0 creates it.
func RemoteRunDir(root string, now time.Time) (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("run: new run directory: %w", err)
	}
	return filepath.Join(root, fmt.Sprintf("%s-%x", runDirName(now), b)), nil
}
