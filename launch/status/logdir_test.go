package status

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/launch/proto"
)

func TestLogDirLayout(t *testing.T) {
	dir := t.TempDir()
	v, err := NewLogDir(dir, "run-1", 2)
	if err != nil {
		t.Fatal(err)
	}
	part := logLine(1, "stdout", "partial")
	part.Partial = true
	for _, ev := range []proto.Event{
		started(0, 1, 0), started(1, 2, 0), started(2, 3, 0),
		logLine(0, "stdout", "a"), logLine(1, "stderr", "x"), logLine(0, "stderr", "b"),
		part, logLine(0, "stdout", ""), node(proto.EventHeartbeat),
		{Type: proto.EventLog, Rank: -1, Line: "node-level"},
	} {
		v.Event(ev)
	}
	attempt := filepath.Join(dir, "run-1", "attempt-2")
	t.Run("flushed on heartbeat", func(t *testing.T) {
		if b, _ := os.ReadFile(filepath.Join(attempt, "rank-0.log")); string(b) != "a\nb\n\n" {
			t.Errorf("rank-0.log before Close = %q", b)
		}
	})
	v.Event(logLine(0, "stdout", "c"))
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"rank-0.log": "a\nb\n\nc\n", "rank-1.log": "x\npartial\n"}
	entries, err := os.ReadDir(attempt)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(want) {
		t.Errorf("files %v, want only %d (no file for a rank without output)", entries, len(want))
	}
	for name, content := range want {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(attempt, name)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != content {
				t.Errorf("content = %q, want %q", b, content)
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
				t.Errorf("mode = %v, want 0644", fi.Mode().Perm())
			}
		})
	}
	if fi, _ := os.Stat(attempt); fi.Mode().Perm() != 0o755 {
		t.Errorf("attempt dir mode = %v, want 0755", fi.Mode().Perm())
	}
}

func TestLogDirRefuses(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "run", "attempt-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, runID string
		attempt     int
	}{
		{"existing attempt dir", "run", 0},
		{"empty run id", "", 0},
		{"run id with slash", "a/b", 0},
		{"run id dot dot", "..", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewLogDir(dir, tt.runID, tt.attempt); err == nil {
				t.Error("NewLogDir succeeded, want an error")
			}
		})
	}
	t.Run("next attempt is fine", func(t *testing.T) {
		v, err := NewLogDir(dir, "run", 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Close(); err != nil {
			t.Error(err)
		}
	})
}

func TestLogDirCloseError(t *testing.T) {
	dir := t.TempDir()
	v, err := NewLogDir(dir, "run", 0)
	if err != nil {
		t.Fatal(err)
	}
	// A file that is already there is never written into.
	existing := filepath.Join(dir, "run", "attempt-0", "rank-3.log")
	if err := os.WriteFile(existing, []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	v.Event(logLine(3, "stdout", "new"))
	v.Event(logLine(4, "stdout", "other rank still logged"))
	err = v.Close()
	if err == nil || !strings.Contains(err.Error(), "rank-3.log") {
		t.Errorf("Close() = %v, want an error naming rank-3.log", err)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep\n" {
		t.Errorf("existing file changed to %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "run", "attempt-0", "rank-4.log")); string(b) != "other rank still logged\n" {
		t.Errorf("rank-4.log = %q", b)
	}
}
