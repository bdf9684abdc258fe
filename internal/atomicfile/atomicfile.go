// Package atomicfile writes files that users name (checkpoints, exported
// weights, token files) so that a reader sees the old file or the complete
// new one, never a part, and so that nothing but a regular file is ever
// replaced.
//
// A write goes to a hidden temporary file next to its destination, which is
// fsynced, renamed over the destination, and the directory fsynced. A
// rename replaces whatever has the name, so the destination is checked twice:
// when the write starts, to fail before any work, and right before the
// rename, to catch what appeared meanwhile. A device, FIFO, socket or
// directory is refused with a *NotRegularError: replacing /dev/null with a
// regular file, as root, breaks the machine. A symbolic link is followed, and
// the file it points to (which must be regular or absent) is replaced; the
// link stays, as with any editor or shell redirection.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// TempMarker is in the name of every temporary file, which is
// ".NAME" + TempMarker + random: a name that starts with a dot and contains
// it is never a finished file, so what an interrupted write leaves behind
// can be recognised and removed (IsTemp).
const TempMarker = ".tmp-"

// IsTemp reports whether name (a base name) is a temporary file of this
// package.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, TempMarker)
}

// maxLinks bounds the symbolic links followed, as the kernel's ELOOP does.
const maxLinks = 40

// NotRegularError is a destination that exists and is not a regular file
// (nor a symbolic link to one), which a write must not replace.
type NotRegularError struct {
	Path   string      // as the caller named it
	Target string      // what Path resolves to through symbolic links; Path if none
	Mode   fs.FileMode // of Target
}

// Error names the path, what it is, and what to do.
func (e *NotRegularError) Error() string {
	what := kind(e.Mode)
	if e.Target != e.Path {
		what = "links to " + e.Target + ", " + what
	} else {
		what = "is " + what
	}
	return fmt.Sprintf("%s %s, not a regular file: gtrain writes an output whole, renaming a new file into place, and replaces nothing but a regular file; name a new or regular file", e.Path, what)
}

// kind says what a non-regular file mode is, with an article.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "a special file"
}

// Resolve returns the file a write of path replaces: path itself or, when
// path is a symbolic link (or a chain of them), the file it finally points
// to. That file must be a regular file or absent (a dangling link is
// written through); anything else is a *NotRegularError.
func Resolve(path string) (string, error) {
	target := path
	for hops := 0; ; hops++ {
		fi, err := os.Lstat(target)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return target, nil
		case err != nil:
			return "", err
		case fi.Mode().IsRegular():
			return target, nil
		case fi.Mode()&fs.ModeSymlink == 0:
			return "", &NotRegularError{Path: path, Target: target, Mode: fi.Mode()}
		case hops == maxLinks:
			return "", &fs.PathError{Op: "resolve", Path: path, Err: syscall.ELOOP}
		}
		link, err := os.Readlink(target)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(link) {
			// Not filepath.Join: cleaning "dir/../x" lexically is wrong when
			// dir is itself a link.
			dir, _ := filepath.Split(target)
			link = dir + link
		}
		target = link
	}
}

// splitDir is the directory part of path with its trailing separator, not
// cleaned, or "./" for a bare name.
func splitDir(path string) string {
	dir, _ := filepath.Split(path)
	if dir == "" {
		return "." + string(filepath.Separator)
	}
	return dir
}

// checkTarget fails unless target is absent or a regular file: a link or a
// special file may have appeared there since Resolve.
func checkTarget(path, target string) error {
	fi, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return &NotRegularError{Path: path, Target: target, Mode: fi.Mode()}
	}
	return nil
}

// File is a temporary file that becomes its destination on Commit. Write
// to it as to any io.Writer; a File is not safe for concurrent use.
type File struct {
	path   string // as named
	target string // what is replaced: path, or the file its links point to
	tmp    string
	f      *os.File
	done   bool
}

// Create starts writing path: it resolves symbolic links, refuses a
// destination that is not a regular file or absent, and creates the
// temporary file in the destination's directory (so that the rename stays
// within one file system). The new file gets the permissions of the file it
// replaces, or 0644. Call Commit to finish, and Abort (deferred; a no-op
// after Commit) on failure.
func Create(path string) (*File, error) {
	target, err := Resolve(path)
	if err != nil {
		return nil, err
	}
	dir, base := filepath.Split(target)
	if base == "" || base == "." || base == ".." {
		return nil, &fs.PathError{Op: "create", Path: path, Err: syscall.EISDIR}
	}
	if dir == "" {
		dir = "."
	}
	perm := fs.FileMode(0o644)
	if fi, err := os.Lstat(target); err == nil {
		perm = fi.Mode().Perm()
	}
	f, err := os.CreateTemp(dir, "."+base+TempMarker+"*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // CreateTemp's path is a pattern, not a file to name
		}
		return nil, &fs.PathError{Op: "create", Path: path, Err: err}
	}
	a := &File{path: path, target: target, tmp: f.Name(), f: f}
	// CreateTemp makes the file 0600; outputs are read by other tools and
	// users as any file the user creates would be.
	if err := f.Chmod(perm); err != nil {
		a.Abort()
		return nil, err
	}
	return a, nil
}

// Write writes p to the temporary file.
func (a *File) Write(p []byte) (int, error) { return a.f.Write(p) }

// Target is the file that Commit replaces: the path given to Create, or
// the file its symbolic links point to.
func (a *File) Target() string { return a.target }

// Commit syncs the temporary file, checks the destination once more, renames
// the file over it and syncs the directory, so that after a crash the
// destination is the old file or the complete new one. On error the
// temporary file is removed and the destination is untouched.
func (a *File) Commit() error {
	if a.done {
		return fmt.Errorf("atomicfile: commit %s: already committed or aborted", a.path)
	}
	err := a.f.Sync()
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = checkTarget(a.path, a.target)
	}
	if err == nil {
		err = os.Rename(a.tmp, a.target)
	}
	if err != nil {
		a.Abort()
		return err
	}
	a.done = true
	return SyncDir(splitDir(a.target))
}

// Abort closes and removes the temporary file unless it was committed.
func (a *File) Abort() {
	if a.done {
		return
	}
	a.done = true
	a.f.Close()
	os.Remove(a.tmp)
}

// Write writes path atomically with what fill writes.
func Write(path string, fill func(w io.Writer) error) error {
	a, err := Create(path)
	if err != nil {
		return err
	}
	defer a.Abort()
	if err := fill(a); err != nil {
		return err
	}
	return a.Commit()
}

// SyncDir fsyncs a directory, making the entries created, renamed or
// removed in it durable. File systems that cannot sync a directory (EINVAL)
// are not an error: there is nothing more to do on them.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// OpenAppend opens path for appending, creating it with perm if absent, for
// files that grow by a line at a time (known_hosts). Symbolic links are
// followed, but what they lead to must be a regular file: appending to a
// device writes into it, and opening a FIFO blocks until it has a reader.
// Anything else is a *NotRegularError.
func OpenAppend(path string, perm fs.FileMode) (*os.File, error) {
	target, err := Resolve(path)
	if err != nil {
		return nil, err
	}
	// O_NONBLOCK: a FIFO that appears after Resolve fails to open (ENXIO)
	// instead of blocking; the check after open then refuses it.
	f, err := os.OpenFile(target, os.O_APPEND|os.O_CREATE|os.O_WRONLY|syscall.O_NONBLOCK, perm)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = &NotRegularError{Path: path, Target: target, Mode: fi.Mode()}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
