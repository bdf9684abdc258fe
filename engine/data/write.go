package data

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// TokenWriter writes a token file atomically: tokens go to a temporary file
// in the destination's directory, and only Commit (after an fsync) renames
// it to the destination. Until then the destination is untouched, so an
// interrupted writer never leaves a truncated file that looks valid.
type TokenWriter struct {
	path string
	f    *atomicFile
	w    *bufio.Writer
	n    int64
	buf  [8192]byte // tokens encoded for w
}

// CreateTokens starts writing the token file path. Call Commit to finish it,
// and Abort (deferred; a no-op after Commit) to drop it on failure.
func CreateTokens(path string) (*TokenWriter, error) {
	f, err := createAtomic(path)
	if err != nil {
		return nil, err
	}
	return &TokenWriter{path: path, f: f, w: bufio.NewWriterSize(f.f, 1<<20)}, nil
}

// WriteTokens appends toks.
func (w *TokenWriter) WriteTokens(toks []uint16) error {
	for len(toks) > 0 {
		n := min(len(toks), len(w.buf)/2)
		for i, t := range toks[:n] {
			binary.LittleEndian.PutUint16(w.buf[2*i:], t)
		}
		if err := w.flushBuf(n); err != nil {
			return err
		}
		toks = toks[n:]
	}
	return nil
}

// WriteByteTokens appends each byte of b as one token of the byte-level
// vocabulary (its value).
func (w *TokenWriter) WriteByteTokens(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), len(w.buf)/2)
		for i, c := range b[:n] {
			w.buf[2*i], w.buf[2*i+1] = c, 0
		}
		if err := w.flushBuf(n); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// flushBuf writes the first n encoded tokens of w.buf.
func (w *TokenWriter) flushBuf(n int) error {
	if _, err := w.w.Write(w.buf[:2*n]); err != nil {
		return fmt.Errorf("data: write %s: %w", w.path, err)
	}
	w.n += int64(n)
	return nil
}

// Len is the number of tokens written so far.
func (w *TokenWriter) Len() int64 { return w.n }

// Commit flushes, syncs and renames the file into place.
func (w *TokenWriter) Commit() error {
	if err := w.w.Flush(); err != nil {
		w.Abort()
		return fmt.Errorf("data: write %s: %w", w.path, err)
	}
	return w.f.commit()
}

// Abort removes the temporary file; after Commit it does nothing.
func (w *TokenWriter) Abort() { w.f.abort() }

// WriteFile writes toks as the token file path, atomically.
func WriteFile(path string, toks []uint16) error {
	w, err := CreateTokens(path)
	if err != nil {
		return err
	}
	defer w.Abort()
	if err := w.WriteTokens(toks); err != nil {
		return err
	}
	return w.Commit()
}

// atomicFile is a temporary file that becomes path on commit.
type atomicFile struct {
	path, tmp string
	f         *os.File
	done      bool
}

// createAtomic creates a hidden temporary file next to path: the same
// directory, so the rename is atomic (one file system).
func createAtomic(path string) (*atomicFile, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // CreateTemp's path is a pattern, not a file to name
		}
		return nil, fmt.Errorf("data: create %s: %w", path, err)
	}
	return &atomicFile{path: path, tmp: f.Name(), f: f}, nil
}

// commit syncs the file, renames it into place and syncs the directory, so
// that after a crash the file is either the old one or complete.
func (a *atomicFile) commit() error {
	if a.done {
		return fmt.Errorf("data: write %s: already committed or aborted", a.path)
	}
	err := a.f.Sync()
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(a.tmp, a.path)
	}
	if err != nil {
		a.abort()
		return fmt.Errorf("data: write %s: %w", a.path, err)
	}
	a.done = true
	if d, err := os.Open(filepath.Dir(a.path)); err == nil {
		// Best effort: some file systems cannot sync a directory.
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// abort closes and removes the temporary file unless it was committed.
func (a *atomicFile) abort() {
	if a.done {
		return
	}
	a.done = true
	a.f.Close()
	os.Remove(a.tmp)
}

// writeAtomic writes path atomically with fill.
func writeAtomic(path string, fill func(io.Writer) error) error {
	a, err := createAtomic(path)
	if err != nil {
		return err
	}
	defer a.abort()
	if err := fill(a.f); err != nil {
		return fmt.Errorf("data: write %s: %w", path, err)
	}
	return a.commit()
}
