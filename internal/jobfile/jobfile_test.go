package jobfile

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/engine/train"
	"github.com/gtrain/gtrain/internal/usage"
)

// TestDefaultJobFileMatchesBuiltIn keeps examples/jobs/default.yaml and
// the embedded default job the same job.
func TestDefaultJobFileMatchesBuiltIn(t *testing.T) {
	got, err := Load(t.Context(), "../../examples/jobs/default.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := train.DefaultSpec(); !reflect.DeepEqual(got, want) {
		t.Errorf("examples/jobs/default.yaml:\n%+v\nbuilt-in default:\n%+v", got, want)
	}
}

func TestExampleJobsLoad(t *testing.T) {
	files, _ := filepath.Glob("../../examples/jobs/*.yaml")
	if len(files) < 2 {
		t.Fatalf("example jobs: %v", files)
	}
	for _, f := range files {
		if _, err := Load(t.Context(), f, nil); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestLoad(t *testing.T) {
	write := func(t *testing.T, body string) string {
		p := filepath.Join(t.TempDir(), "job.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("file over defaults, --set over file", func(t *testing.T) {
		p := write(t, "steps: 7\noptim: {lr: 6e-4}\nmodel: {preset: test, layers: 3}\n")
		s, err := Load(t.Context(), p, []string{"optim.lr=1e-3", "checkpoint.keep=5"})
		if err != nil {
			t.Fatal(err)
		}
		d := train.DefaultSpec()
		if s.Steps != 7 || s.Optim.LR != 1e-3 || s.Checkpoint.Keep != 5 || s.Model.Preset != "test" || s.Model.Layers != 3 {
			t.Errorf("spec %+v", s)
		}
		if s.Optim.Beta2 != d.Optim.Beta2 || s.Batch != d.Batch {
			t.Errorf("keys absent from the file lost their defaults: %+v", s)
		}
	})
	for _, tc := range []struct {
		name, body string
		sets       []string
		want       string
	}{
		{"misspelt key", "stepz: 7\n", nil, "stepz"},
		{"misspelt nested key", "optim: {learning_rate: 1}\n", nil, "learning_rate"},
		{"misspelt --set key", "", []string{"optim.lrr=1"}, "lrr"},
		{"--set without =", "", []string{"steps"}, "key=value"},
		{"wrong type", "steps: many\n", nil, "steps"},
		{"invalid value", "steps: 0\n", nil, "steps 0"},
		{"unknown preset", "model: {preset: gpt5}\n", nil, "gpt5"},
		{"yaml syntax", "steps: [\n", nil, "job.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ""
			if tc.body != "" {
				p = write(t, tc.body)
			}
			_, err := Load(t.Context(), p, tc.sets)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line mentioning %q", err, tc.want)
			}
			if !errors.As(err, new(*usage.Error)) {
				t.Errorf("error %v is not a usage error (exit 2)", err)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		_, err := Load(t.Context(), filepath.Join(t.TempDir(), "nope.yaml"), nil)
		if err == nil || !strings.Contains(err.Error(), "nope.yaml") || !errors.As(err, new(*usage.Error)) {
			t.Errorf("error %v, want a usage error naming nope.yaml", err)
		}
	})
}

// TestOverlay: --set on resume changes the checkpoint's job, not the
// built-in default's keys.
func TestOverlay(t *testing.T) {
	base := train.DefaultSpec()
	base.Steps, base.Model.Preset = 99, "test"
	s, err := Overlay(base, []string{"optim.lr=2e-3"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Steps != 99 || s.Model.Preset != "test" || s.Optim.LR != 2e-3 {
		t.Errorf("overlay of the base spec: %+v", s)
	}
}
