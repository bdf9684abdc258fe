package ckpt

import (
	"errors"
	"io"
	"os"

	"github.com/gtrain/gtrain/internal/atomicfile"
)

// tempMarker is in the name of every temporary file (atomicfile.TempMarker).
const tempMarker = atomicfile.TempMarker

// isTemp reports whether name is a temporary file of writeAtomic. Such
// names start with a dot and are never a rank file, a manifest or a step
// directory, so what an interrupted write leaves behind cannot be taken for
// a checkpoint.
func isTemp(name string) bool { return atomicfile.IsTemp(name) }

// writeAtomic creates path through a temporary file in the same directory
// (atomicfile.Write): readers see the old path or the complete new one,
// never a part; on any error path is untouched. Only a regular file is
// ever replaced: a device, FIFO or directory at path is refused, and a
// symbolic link is written through.
func writeAtomic(path string, write func(w io.Writer) error) error {
	return atomicfile.Write(path, write)
}

// syncDir fsyncs a directory, making the entries created, renamed or
// removed in it durable.
func syncDir(dir string) error { return atomicfile.SyncDir(dir) }

// removeIfExists removes path; it is not an error when it is already gone.
func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
