package data

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/usage"
)

func TestValCount(t *testing.T) {
	tests := []struct {
		name string
		frac float64
		n    int64
		want int64
	}{
		{"rounded", 0.1, 95, 10},
		{"at least one", 0.1, 3, 1},
		{"never all", 0.9, 2, 1},
		{"half", 0.5, 10, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := valCount(tt.frac, tt.n); got != tt.want {
				t.Errorf("valCount(%v, %d) = %d, want %d", tt.frac, tt.n, got, tt.want)
			}
		})
	}
}

// TestPrepareConfigCheck: each bad configuration is a usage error naming
// the flag, refused before anything is written.
func TestPrepareConfigCheck(t *testing.T) {
	tests := []struct {
		name string
		cfg  PrepareConfig
		want string
	}{
		{"val-fraction 0", PrepareConfig{Inputs: []string{"a.txt"}}, "data prepare: --val-fraction 0: want a fraction between 0 and 1, e.g. 0.1"},
		{"val-fraction 1", PrepareConfig{Inputs: []string{"a.txt"}, ValFraction: 1}, "--val-fraction 1: want a fraction"},
		{"synthetic 1", PrepareConfig{Synthetic: 1, ValFraction: 0.1}, "data prepare: --synthetic 1: want at least 2 tokens"},
		{"synthetic negative", PrepareConfig{Synthetic: -5, ValFraction: 0.1}, "--synthetic -5: want at least 2 tokens"},
		{"synthetic huge", PrepareConfig{Synthetic: maxSynthetic + 1, ValFraction: 0.1}, "at most 1099511627776 tokens (2 TiB of token files)"},
		{"synthetic and files", PrepareConfig{Inputs: []string{"a.txt", "b"}, Synthetic: 100, ValFraction: 0.1}, "give it or files (a.txt, b), not both"},
		{"no input", PrepareConfig{ValFraction: 0.1}, "data prepare: no input: give text files or directories of .txt files, or --synthetic N"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Out = filepath.Join(t.TempDir(), "out")
			rep, err := Prepare(context.Background(), tt.cfg, nil)
			var ue *usage.Error
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Prepare = %v, %v; want a usage error containing %q", rep, err, tt.want)
			}
			if _, err := os.Stat(tt.cfg.Out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a refused configuration created %s (stat: %v)", tt.cfg.Out, err)
			}
		})
	}
}

// TestPrepareDocuments: documents are written as EOT and their bytes, the
// last ones to val.bin; an empty one is skipped with a warning; the report
// names the three files, meta.json last.
func TestPrepareDocuments(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{"a.txt": "one", "b.txt": "", "c.txt": "two"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "out")
	var warnings []string
	rep, err := Prepare(context.Background(), PrepareConfig{Inputs: []string{dir}, Out: out, ValFraction: 0.1},
		func(msg string) { warnings = append(warnings, msg) })
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"data prepare: skipping " + filepath.Join(dir, "b.txt") + ": empty"}; !slices.Equal(warnings, want) {
		t.Errorf("warnings = %q, want %q", warnings, want)
	}
	want := []PreparedFile{
		{Path: filepath.Join(out, TrainFile), Tokens: 4, Bytes: 8},
		{Path: filepath.Join(out, ValFile), Tokens: 4, Bytes: 8},
	}
	if len(rep.Files) != 3 || !slices.Equal(rep.Files[:2], want) || rep.Files[2].Path != filepath.Join(out, MetaFile) {
		t.Fatalf("report files = %+v, want %+v and meta.json", rep.Files, want)
	}
	meta, err := ReadMeta(filepath.Join(out, MetaFile))
	if err != nil {
		t.Fatal(err)
	}
	wantSources := []string{filepath.Join(dir, "a.txt"), filepath.Join(dir, "c.txt")}
	if meta.TrainTokens != 4 || meta.ValTokens != 4 || !slices.Equal(meta.Sources, wantSources) || !slices.Equal(rep.Meta.Sources, wantSources) {
		t.Errorf("meta = %+v, report meta = %+v; want 4 and 4 tokens from %q", meta, rep.Meta, wantSources)
	}
	val, err := os.ReadFile(filepath.Join(out, ValFile))
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{0, 1, 't', 0, 'w', 0, 'o', 0}; !slices.Equal(val, want) {
		t.Errorf("val.bin = %v, want EOT and \"two\" as uint16 LE: %v", val, want)
	}
}

// TestPrepareInterrupted: a prepare whose context has ended returns the
// context's cause and leaves neither token files nor temporary files.
func TestPrepareInterrupted(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "a.txt")
	if err := os.WriteFile(in, []byte(strings.Repeat("text ", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	cause := errors.New("interrupted by SIGINT")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	rep, err := Prepare(ctx, PrepareConfig{Inputs: []string{in}, Out: out, ValFraction: 0.1}, nil)
	if !errors.Is(err, cause) || rep != nil {
		t.Fatalf("Prepare = %v, %v; want nil and the context's cause", rep, err)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("an interrupted prepare left %v in %s", entries, out)
	}
}
