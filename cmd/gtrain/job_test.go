package main

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/train"
)

// TestDefaultJobFileMatchesBuiltIn keeps examples/jobs/default.yaml and
// the embedded default job the same job.
func TestDefaultJobFileMatchesBuiltIn(t *testing.T) {
	got, err := loadJob(context.Background(), "../../examples/jobs/default.yaml", nil)
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
		if _, err := loadJob(context.Background(), f, nil); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestLoadJob(t *testing.T) {
	write := func(t *testing.T, body string) string {
		p := filepath.Join(t.TempDir(), "job.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("file over defaults, --set over file", func(t *testing.T) {
		p := write(t, "steps: 7\noptim: {lr: 6e-4}\nmodel: {preset: test, layers: 3}\n")
		s, err := loadJob(context.Background(), p, []string{"optim.lr=1e-3", "checkpoint.keep=5"})
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
			_, err := loadJob(context.Background(), p, tc.sets)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line mentioning %q", err, tc.want)
			}
			if ExitCode(err) != ExitUsage {
				t.Errorf("exit code %d, want %d", ExitCode(err), ExitUsage)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		_, err := loadJob(context.Background(), filepath.Join(t.TempDir(), "nope.yaml"), nil)
		if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
			t.Errorf("error %v", err)
		}
	})
}

// TestEngineJobCheckpointDir: the default checkpoint directory is
// runs/<start time>, created at once; two runs started in the same second
// get two directories. A dry run creates none, and a hostfile job's name is
// unique without being created here.
func TestEngineJobCheckpointDir(t *testing.T) {
	now := time.Date(2026, 11, 22, 19, 30, 12, 0, time.UTC)
	dir := t.TempDir()
	s, js, err := engineJob(train.DefaultSpec(), dir, now)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "runs", "20261122-193012"); s.Checkpoint.Dir != want {
		t.Errorf("checkpoint dir %s, want %s", s.Checkpoint.Dir, want)
	}
	if !strings.Contains(js, `"layers":4`) {
		t.Errorf("the spec for the ranks is not resolved: %s", js)
	}
	s2, _, err := engineJob(train.DefaultSpec(), dir, now)
	if err != nil {
		t.Fatal(err)
	}
	if s2.Checkpoint.Dir == s.Checkpoint.Dir {
		t.Errorf("a second run in the same second reuses %s", s.Checkpoint.Dir)
	}
	for _, d := range []string{s.Checkpoint.Dir, s2.Checkpoint.Dir} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			t.Errorf("%s was not created: %v", d, err)
		}
	}
	root := filepath.Join(dir, "runs")
	if next, err := nextRunDir(root, now); err != nil || next != filepath.Join(root, "20261122-193012-3") {
		t.Errorf("dry run: %q, %v; want the next free name, -3", next, err)
	}
	a, _ := remoteRunDir(root, now)
	b, _ := remoteRunDir(root, now)
	if a == b || !strings.HasPrefix(filepath.Base(a), "20261122-193012-") {
		t.Errorf("hostfile jobs in the same second: %s and %s", a, b)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 2 {
		t.Errorf("%s holds %d entries, want the 2 created", root, len(ents))
	}
}

// TestFreshRunDirConcurrent: runs choosing their directory at the same
// moment in separate goroutines each get their own.
func TestFreshRunDirConcurrent(t *testing.T) {
	now := time.Date(2026, 11, 22, 19, 30, 12, 0, time.UTC)
	root := filepath.Join(t.TempDir(), "runs")
	const n = 8
	dirs := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			d, err := freshRunDir(root, now)
			if err != nil {
				t.Error(err)
			}
			dirs <- d
		})
	}
	wg.Wait()
	close(dirs)
	seen := map[string]bool{}
	for d := range dirs {
		if seen[d] {
			t.Errorf("%s given to two runs", d)
		}
		seen[d] = true
	}
	if len(seen) != n {
		t.Errorf("%d directories for %d runs", len(seen), n)
	}
}
