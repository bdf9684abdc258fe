package data

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/gtrain/gtrain/internal/atomicfile"
)

// TokenWriter writes a token file atomically: tokens go to a temporary file
// in the destination's directory, and only Commit (after an fsync) renames
// it to the destination. Until then the destination is untouched, so an
// interrupted writer never leaves a truncated file that looks valid.
type TokenWriter struct {
	path string
	f    *atomicfile.File
	w    *bufio.Writer
	n    int64
	buf  [8192]byte // tokens encoded for w
}

// CreateTokens starts writing the token file path. Call Commit to finish it,
// and Abort (deferred; a no-op after Commit) to drop it on failure. Only a
// regular file is replaced: a device, FIFO or directory at path is refused
// (an *atomicfile.NotRegularError), and a symbolic link is written through.
func CreateTokens(path string) (*TokenWriter, error) {
	f, err := atomicfile.Create(path)
	if err != nil {
		return nil, fmt.Errorf("data: create %s: %w", path, err)
	}
	return &TokenWriter{path: path, f: f, w: bufio.NewWriterSize(f, 1<<20)}, nil
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
	if err := w.f.Commit(); err != nil {
		return fmt.Errorf("data: write %s: %w", w.path, err)
	}
	return nil
}

// Abort removes the temporary file; after Commit it does nothing.
func (w *TokenWriter) Abort() { w.f.Abort() }

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

// writeAtomic writes path atomically with fill.
func writeAtomic(path string, fill func(io.Writer) error) error {
	if err := atomicfile.Write(path, fill); err != nil {
		return fmt.Errorf("data: write %s: %w", path, err)
	}
	return nil
}
