package ckpt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// tempMarker is in the name of every file being written. Such names start
// with a dot and are never a rank file, a manifest or a step directory, so
// what an interrupted write leaves behind cannot be taken for a checkpoint.
const tempMarker = ".tmp-"

// isTemp reports whether name is a temporary file of writeAtomic.
func isTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tempMarker)
}

// writeAtomic creates path through a temporary file in the same directory:
// write fills it, then it is fsynced, renamed over path and the directory
// fsynced. Readers see the old path or the complete new one, never a part;
// on any error the temporary file is removed and path is untouched.
func writeAtomic(path string, write func(f *os.File) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+tempMarker+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = write(f); err != nil {
		return err
	}
	// CreateTemp makes the file 0600; checkpoints are read by other tools
	// and users as any output file would be.
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir fsyncs a directory, making the entries created, renamed or
// removed in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// removeIfExists removes path; it is not an error when it is already gone.
func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
