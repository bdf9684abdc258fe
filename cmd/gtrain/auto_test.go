package main

import (
	"strings"
	"testing"
)

// TestAutoCommandConflict: --auto with a command is a usage error.
func TestAutoCommandConflict(t *testing.T) {
	code, _, stderr := runMain(t, "run", "--auto", "--", "true")
	if code != ExitUsage || !strings.Contains(stderr, "run: --auto lays out the built-in engine") {
		t.Errorf("exit %d, %q", code, stderr)
	}
}
