package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
)

// EnvJobSpec carries the resolved job spec (JSON) from the launcher to every
// rank of the built-in engine. It is not a secret, and an environment
// variable travels to remote hosts inside the agent's spec.
const EnvJobSpec = "GTRAIN_JOB_SPEC"

// loadJob reads a job: the built-in default, overlaid with the YAML job file
// (when path is not empty) and then with key=value settings (--set
// optim.lr=3e-4). Unknown keys are errors: a misspelt key silently ignored
// is a run with the wrong hyperparameters. The file is read with a limit
// of userfile.ConfigLimit, and loadJob returns as soon as ctx is done.
func loadJob(ctx context.Context, path string, sets []string) (train.Spec, error) {
	spec := train.DefaultSpec()
	if path == "" {
		return decodeJob(spec, "", nil, sets)
	}
	text, err := userfile.Read(ctx, path, userfile.ConfigLimit)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return spec, usage.Errorf("job: %s: no such file", path)
		}
		return spec, userfile.Prefix(ctx, "job", err)
	}
	return decodeJob(spec, path, text, sets)
}

// overlayJob applies --set values to another base spec (resume: the
// checkpoint's).
func overlayJob(spec train.Spec, sets []string) (train.Spec, error) {
	return decodeJob(spec, "", nil, sets)
}

// decodeJob overlays spec with the job file path, whose contents are text
// (when path is not empty), and then with sets.
func decodeJob(spec train.Spec, path string, text []byte, sets []string) (train.Spec, error) {
	v := viper.New()
	if path != "" {
		v.SetConfigFile(path) // its extension picks the format; ReadConfig reads text
		if filepath.Ext(path) == "" {
			v.SetConfigType("yaml")
		}
		if err := v.ReadConfig(bytes.NewReader(text)); err != nil {
			return spec, usage.Errorf("job: %s: %s", path, oneLine(err))
		}
	}
	for _, kv := range sets {
		k, val, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return spec, usage.Errorf("job: --set %q: want key=value, e.g. --set optim.lr=3e-4", kv)
		}
		v.Set(strings.TrimSpace(k), val)
	}
	err := v.Unmarshal(&spec, func(dc *mapstructure.DecoderConfig) {
		dc.ErrorUnused = true
		dc.WeaklyTypedInput = true
	})
	if err != nil {
		where := "--set"
		if path != "" {
			where = path
		}
		return spec, usage.Errorf("job: %s: %s", where, oneLine(err))
	}
	if err := spec.Validate(); err != nil {
		if path != "" {
			err = fmt.Errorf("%s: %w", path, err)
		}
		return spec, &usage.Error{Err: err}
	}
	return spec, nil
}

// oneLine joins a multi-line decode error into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

// engineJob prepares spec for its ranks: resolved, with an absolute
// checkpoint directory (a new runs/<time> under dir, created now, when the
// spec names none), and encoded for EnvJobSpec.
func engineJob(spec train.Spec, dir string, now time.Time) (train.Spec, string, error) {
	return engineJobIn(spec, dir, func(root string) (string, error) { return freshRunDir(root, now) })
}

// engineJobIn is engineJob with the default checkpoint directory chosen
// by newRun, given the directory of runs.
func engineJobIn(spec train.Spec, dir string, newRun func(root string) (string, error)) (train.Spec, string, error) {
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
	b, err := json.Marshal(spec)
	if err != nil {
		return spec, "", fmt.Errorf("job: encode: %w", err)
	}
	return spec, string(b), nil
}

// runDirName is the name of a new run's directory: its start time.
func runDirName(now time.Time) string { return now.Format("20060102-150405") }

// freshRunDir creates root/<YYYYmmdd-HHMMSS>, or with a suffix (-2, -3,
// ...) when that exists, and returns it. The directory is made with
// os.Mkdir, which fails on an existing one: two runs started in the same
// second never share a directory.
func freshRunDir(root string, now time.Time) (string, error) {
	dir, err := ckpt.MkdirUnique(root, runDirName(now))
	if err != nil {
		return "", fmt.Errorf("run: new run directory in %s: %w", root, err)
	}
	return dir, nil
}

// nextRunDir is the directory freshRunDir would create now, for a dry run,
// which creates nothing.
func nextRunDir(root string, now time.Time) (string, error) {
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

// remoteRunDir names a new run's directory on hosts this machine cannot
// see (a hostfile job): its start time and a random suffix, since no
// os.Mkdir here can make the name unique there. Rank 0 creates it.
func remoteRunDir(root string, now time.Time) (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("run: new run directory: %w", err)
	}
	return filepath.Join(root, fmt.Sprintf("%s-%x", runDirName(now), b)), nil
}
