// Package userfile reads the files a user names to gtrain (hostfiles, job,
// config and env files, plan topologies, text to tokenize) so that no such
// file can exhaust memory or hold up an interrupt.
//
// Every read has a size limit: /dev/zero named as a hostfile is refused after
// the limit instead of being read until the machine runs out of memory.
// Opening and reading happen in a goroutine, and the caller returns as soon
// as its context is done: open(2) of a FIFO with no writer, or a read of a
// terminal or a pipe nobody writes to, blocks in the kernel where no context
// reaches. That goroutine stays blocked until the file answers or the
// process exits, which is what a command that was interrupted does next.
package userfile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// ConfigLimit is the size limit of the small text files a user writes by
// hand: hostfiles, job and config files, env files and plan topologies.
// 4 MiB is some thousand times the largest real one (a hostfile of 65536
// hosts, the most a job may have, is about 1.5 MiB), and small enough that
// reading and parsing it takes a moment and little memory.
const ConfigLimit = 4 << 20

// ErrTooLarge is the Err of an [*Error] for a file over its limit.
var ErrTooLarge = errors.New("file too large")

// ErrNotRegular is the Err of an [*Error] for a FIFO, device or socket
// that [ReadRegular] refuses.
var ErrNotRegular = errors.New("not a regular file")

// Error is a file the user named that cannot be used as one: it is missing,
// unreadable, a directory, or larger than its limit. It is the user's to
// fix by naming another file (gtrain exits 2 for it); a failure while
// reading an opened file is an I/O error instead, and not an *Error.
type Error struct {
	Path  string
	Err   error // a syscall.Errno (ENOENT, EACCES, EISDIR, ...), or ErrTooLarge
	Limit int64 // the limit, with ErrTooLarge
}

func (e *Error) Error() string {
	if errors.Is(e.Err, ErrTooLarge) {
		return fmt.Sprintf("%s: larger than %s, the limit for this file: is it the right file?", e.Path, Size(e.Limit))
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Read returns the contents of the file at path, or an [*Error] when it has
// more than limit bytes. It returns context.Cause(ctx) as soon as ctx is
// done, even while open or read is blocked.
func Read(ctx context.Context, path string, limit int64) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	done := make(chan result, 1) // buffered: an abandoned reader does not block
	go func() {
		b, err := readFile(path, limit)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		return r.b, r.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func readFile(path string, limit int64) ([]byte, error) {
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadAll(f, path, limit)
}

// ReadAll reads r to the end, or to just past limit bytes: then it returns an
// [*Error] with ErrTooLarge naming path. Other read errors are I/O errors,
// wrapped with path.
func ReadAll(r io.Reader, path string, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", path, UnwrapPath(err))
	case int64(len(b)) > limit:
		return nil, &Error{Path: path, Err: ErrTooLarge, Limit: limit}
	}
	return b, nil
}

// ReadRegular returns the contents of the regular file at path (or of the
// one a symbolic link at path names), or an [*Error] when it has more than
// limit bytes or is not a regular file. It is [Read] for callers with no
// context to give, and for files that another package reads again by name:
// a regular file can neither block its open or read (a FIFO is opened
// O_NONBLOCK, which does not wait for a writer, then refused) nor be read
// without end (/dev/zero is refused).
func ReadRegular(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, &Error{Path: path, Err: UnwrapPath(err)}
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return nil, fmt.Errorf("stat %s: %w", path, UnwrapPath(err))
	case fi.IsDir():
		return nil, &Error{Path: path, Err: syscall.EISDIR}
	case !fi.Mode().IsRegular():
		return nil, &Error{Path: path, Err: ErrNotRegular}
	case fi.Size() > limit: // refused unread; ReadAll still bounds a file that grows
		return nil, &Error{Path: path, Err: ErrTooLarge, Limit: limit}
	}
	return ReadAll(f, path, limit)
}

// Open opens the file at path for reading, returning context.Cause(ctx) as
// soon as ctx is done even while open(2) blocks (a FIFO with no writer). A
// directory, or a file that cannot be opened, is an [*Error]. Reads of the
// returned file may still block: use it for regular files, or read in
// pieces with ctx checked between them.
func Open(ctx context.Context, path string) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	done := make(chan result, 1)
	go func() {
		f, err := open(path)
		done <- result{f, err}
	}()
	select {
	case r := <-done:
		return r.f, r.err
	case <-ctx.Done():
		// Close the file should the open still succeed: nobody will read it.
		go func() {
			if r := <-done; r.f != nil {
				r.f.Close()
			}
		}()
		return nil, context.Cause(ctx)
	}
}

// open opens path and refuses a directory, whose read would fail with an
// error that does not say the user named a directory.
func open(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &Error{Path: path, Err: UnwrapPath(err)}
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", path, UnwrapPath(err))
	}
	if fi.IsDir() {
		f.Close()
		return nil, &Error{Path: path, Err: syscall.EISDIR}
	}
	return f, nil
}

// UnwrapPath drops the *fs.PathError around an errno: its "open PATH:"
// repeats what the callers' messages say already.
func UnwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Size formats a byte count the way limits are stated: 4 MiB, 512 KiB, 3 GiB.
func Size(n int64) string {
	units := []string{"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	f := float64(n)
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d bytes", n)
	}
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d %s", int64(f), units[i])
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}

// Prefix is err from reading a file the user named, prefixed "op: " (the
// command or package that read it; userfile's errors name the file), except
// when it is ctx's end: an interrupt is reported as itself.
func Prefix(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
		return err
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Names lists the entries of directory dir whose names begin with prefix,
// in directory order: it reads at most maxScan names and keeps at most
// maxNames, so that a directory of millions of entries (a crowded TMPDIR,
// a host with thousands of network interfaces) costs a bounded read. A
// directory that cannot be read gives what was read before the error.
func Names(dir, prefix string, maxScan, maxNames int) []string {
	d, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer d.Close()
	var names []string
	for read := 0; read < maxScan && len(names) < maxNames; {
		ents, err := d.ReadDir(min(256, maxScan-read))
		read += len(ents)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix) && len(names) < maxNames {
				names = append(names, e.Name())
			}
		}
		if err != nil {
			break
		}
	}
	return names
}
