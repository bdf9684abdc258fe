package ckpt

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gtrain/gtrain/internal/atomicfile"
)

// TestSpecialDestinations: checkpoint files and exports only ever replace
// regular files. A FIFO where a rank file goes, or named as the export, is
// refused and stays; an export through a symbolic link replaces the link's
// target and keeps the link.
func TestSpecialDestinations(t *testing.T) {
	root := t.TempDir()
	mustWrite(t, root, 1, 1, 0)
	c, err := Open(t.Context(), filepath.Join(root, StepDirName(1)))
	must(t, err)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pipe")
	must(t, syscall.Mkfifo(fifo, 0o644))
	must(t, os.Symlink("pipe", filepath.Join(dir, "to-pipe")))

	var nr *atomicfile.NotRegularError
	for _, out := range []string{fifo, filepath.Join(dir, "to-pipe")} {
		if err := Export(t.Context(), c, out, ExportOptions{}); !errors.As(err, &nr) {
			t.Errorf("Export to %s = %v, want a *atomicfile.NotRegularError", out, err)
		}
	}
	step2 := filepath.Join(root, StepDirName(2))
	must(t, os.MkdirAll(step2, 0o755))
	must(t, syscall.Mkfifo(filepath.Join(step2, RankFileName(0)), 0o644))
	if _, err := WriteShard(root, 2, 0, fullTensors(2, 1), stateOf(2, 0)); !errors.As(err, &nr) {
		t.Errorf("WriteShard over a FIFO = %v, want a *atomicfile.NotRegularError", err)
	}
	for _, p := range []string{fifo, filepath.Join(step2, RankFileName(0))} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
			t.Errorf("%s is no FIFO any more (%v)", p, err)
		}
	}

	link := filepath.Join(dir, "m.safetensors")
	must(t, os.Symlink("real.safetensors", link))
	must(t, Export(t.Context(), c, link, ExportOptions{}))
	if got, err := os.Readlink(link); err != nil || got != "real.safetensors" {
		t.Errorf("the link now points to %q (%v)", got, err)
	}
	if tensors, _ := readExport(t, filepath.Join(dir, "real.safetensors")); len(tensors) == 0 {
		t.Error("the link's target holds no tensors")
	}
}
