// Package jobfile reads the job of the built-in engine as the user writes
// it: the built-in default job (train.DefaultSpec), overlaid with a YAML
// job file and then with key=value settings (--set optim.lr=3e-4), decoded
// with viper. It is the launcher's side of a job; the ranks get the
// resolved train.Spec as JSON and never read YAML, which keeps viper (and
// package spf13) out of the engine.
package jobfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
)

// Load reads a job: the built-in default, overlaid with the YAML job file
// (when path is not empty) and then with key=value settings (--set
// optim.lr=3e-4). Unknown keys are errors: a misspelt key silently ignored
// is a run with the wrong hyperparameters. The file is read with a limit
// of userfile.ConfigLimit, and Load returns as soon as ctx is done. Bad
// input is a *usage.Error.
func Load(ctx context.Context, path string, sets []string) (train.Spec, error) {
	spec := train.DefaultSpec()
	if path == "" {
		return decode(spec, "", nil, sets)
	}
	text, err := userfile.Read(ctx, path, userfile.ConfigLimit)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return spec, usage.Errorf("job: %s: no such file", path)
		}
		return spec, userfile.Prefix(ctx, "job", err)
	}
	return decode(spec, path, text, sets)
}

// Overlay applies key=value settings to another base spec (resume: the
// checkpoint's).
func Overlay(spec train.Spec, sets []string) (train.Spec, error) {
	return decode(spec, "", nil, sets)
}

// decode overlays spec with the job file path, whose contents are text
// (when path is not empty), and then with sets.
func decode(spec train.Spec, path string, text []byte, sets []string) (train.Spec, error) {
	v := viper.New()
	if path != "" {
		v.SetConfigFile(path) // its extension picks the format; ReadConfig reads text
		if filepath.Ext(path) == "" {
			v.SetConfigType("yaml")
		}
		if err := v.ReadConfig(bytes.NewReader(text)); err != nil {
			return spec, usage.Errorf("job: %s: %s", path, usage.OneLine(err))
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
		return spec, usage.Errorf("job: %s: %s", where, usage.OneLine(err))
	}
	if err := spec.Validate(); err != nil {
		if path != "" {
			err = fmt.Errorf("%s: %w", path, err)
		}
		return spec, &usage.Error{Err: err}
	}
	return spec, nil
}
