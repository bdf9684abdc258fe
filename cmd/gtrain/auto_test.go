package main

import (
	"os"
	"path/filepath"
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

// TestAutoHostfileBeforeAgents: on a hostfile's hosts --auto decides
// nothing from this machine. A dry run, which asks no host, previews the
// layout this machine would get and says that it is this machine's; a
// global batch the hosts' ranks cannot split fails at once, before any
// host is dialled (the hosts here do not exist), as it needs no facts.
func TestAutoHostfileBeforeAgents(t *testing.T) {
	hf := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hf, []byte("node-a.invalid slots=2\nnode-b.invalid slots=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runMain(t, "run", "--auto", "--dry-run", "--hostfile", hf)
	preview := "gtrain: --auto: the run plans from what each host's agent reports when it joins; this dry run starts none and previews as if every host were this machine:\ngtrain: --auto: tp="
	if code != ExitOK || !strings.Contains(stderr, preview) {
		t.Errorf("dry run: exit %d, stderr %q: want the preview, said to be this machine's", code, stderr)
	}
	code, _, stderr = runMain(t, "run", "--auto", "--hostfile", hf, "--set", "parallel.pp=3", "--ssh-timeout", "1s")
	if code != ExitUsage || !strings.Contains(stderr, "parallel.pp 3 do not divide the 4 ranks") || strings.Contains(stderr, "node-a.invalid") {
		t.Errorf("pp 3 on 4 ranks: exit %d, stderr %q: want the usage error before any host is dialled", code, stderr)
	}
}
