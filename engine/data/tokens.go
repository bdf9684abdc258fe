package data

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Tokens is a read-only sequence of uint16 token ids: a memory-mapped .bin
// file (Open) or memory (NewTokens). Its methods may be called from several
// goroutines at once, except Close.
type Tokens struct {
	name   string   // the file, for errors; "memory" for NewTokens
	toks   []uint16 // a view of mapped, or the caller's slice
	mapped []byte   // the mapping to unmap on Close; nil for memory

	// The mapped file stays open so that every read can check, with
	// fstat, that it is still the file that was mapped.
	file  *os.File
	fd    int
	size  int64
	mtime unix.Timespec

	maxOnce sync.Once
	max     uint16 // the largest id, computed once by CheckVocab
}

// nativeLittleEndian is true when a uint16 in memory has the byte order of
// the .bin format, so a mapped file can be used in place.
var nativeLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// Open maps the token file at path read-only. The file must hold a whole
// number of uint16 tokens, at least one. On a big-endian machine the file is
// read and converted instead of mapped. Close releases the mapping.
//
// Replacing the file by rename, as WriteFile and gtrain data prepare do,
// leaves the mapping of the old file intact. Truncating it or rewriting it
// in place would make reads fault (SIGBUS) or see other data: every read
// checks the file first and after, and turns a fault into an error, so such
// a change fails the read with a *ChangedError.
func Open(path string) (*Tokens, error) {
	// O_NONBLOCK: a FIFO named as the token file would block the open until
	// a writer came, beyond any signal; checkSize then refuses it.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	fi, err := f.Stat()
	if err == nil {
		err = checkSize(path, fi)
	}
	if err == nil && !nativeLittleEndian {
		defer f.Close()
		return readConverted(path, f, fi.Size())
	}
	var t *Tokens
	if err == nil {
		t, err = mapFile(path, f)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return t, nil
}

// mapFile maps the open token file f, which checkSize accepted.
func mapFile(path string, f *os.File) (*Tokens, error) {
	t := &Tokens{name: path, file: f, fd: int(f.Fd())}
	var st unix.Stat_t
	if err := unix.Fstat(t.fd, &st); err != nil {
		return nil, fmt.Errorf("data: stat %s: %w", path, err)
	}
	t.size, t.mtime = st.Size, st.Mtim
	b, err := unix.Mmap(t.fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("data: map %s: %w", path, err)
	}
	t.mapped = b
	t.toks = unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
	return t, nil
}

// checkSize rejects what cannot be a token file before it is mapped.
func checkSize(path string, fi os.FileInfo) error {
	size := fi.Size()
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("data: %s: not a regular file: give a .bin token file", path)
	case size == 0:
		return fmt.Errorf("data: %s: empty: a token file holds at least one uint16 token; prepare it again (gtrain data prepare)", path)
	case size%2 != 0:
		return fmt.Errorf("data: %s: %d bytes is not a whole number of uint16 tokens: truncated, or not a nanoGPT .bin token file; prepare it again", path, size)
	case size > math.MaxInt:
		return fmt.Errorf("data: %s: %d bytes is too large to map on this machine", path, size)
	}
	return nil
}

// readConverted reads a token file into memory, converting from little
// endian, for machines whose byte order differs from the format's.
func readConverted(path string, f *os.File, size int64) (*Tokens, error) {
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, fmt.Errorf("data: read %s: %w", path, err)
	}
	toks := make([]uint16, size/2)
	for i := range toks {
		toks[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
	}
	return &Tokens{name: path, toks: toks}, nil
}

// NewTokens wraps toks, which the caller must not change afterwards, e.g. a
// synthetic corpus or a test's tokens.
func NewTokens(toks []uint16) *Tokens {
	return &Tokens{name: "memory", toks: toks}
}

// Name is the file the tokens come from, or "memory".
func (t *Tokens) Name() string { return t.name }

// Len is the number of tokens.
func (t *Tokens) Len() int { return len(t.toks) }

// Copy copies the tokens at [off, off+len(dst)), which must be within
// [0, Len), into dst. There is no view of a mapped file: reading one
// outside this package could fault.
func (t *Tokens) Copy(dst []uint16, off int) (err error) {
	if off < 0 || off > len(t.toks)-len(dst) {
		return fmt.Errorf("data: %s: tokens [%d, %d) out of [0, %d)", t.name, off, off+len(dst), len(t.toks))
	}
	if err := t.begin(); err != nil {
		return err
	}
	defer t.end(&err, debug.SetPanicOnFault(true))
	copy(dst, t.toks[off:])
	return nil
}

// Close unmaps a mapped file; the Tokens are empty afterwards. Closing twice,
// or closing memory tokens, does nothing.
func (t *Tokens) Close() error {
	t.toks = nil
	if t.mapped == nil {
		return nil
	}
	b := t.mapped
	t.mapped = nil
	err := unix.Munmap(b)
	if cerr := t.file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("data: unmap %s: %w", t.name, err)
	}
	return nil
}

// CheckVocab returns an error naming the file, the offset and the id of the
// first token that is not below vocab, the model's vocabulary size: such a
// file was prepared with another tokenizer. The file is scanned once; later
// calls cost nothing.
func (t *Tokens) CheckVocab(vocab int) (err error) {
	if vocab <= 0 {
		return fmt.Errorf("data: %s: vocabulary size %d: must be positive", t.name, vocab)
	}
	if err := t.begin(); err != nil {
		return err
	}
	defer t.end(&err, debug.SetPanicOnFault(true))
	t.maxOnce.Do(func() {
		for _, id := range t.toks {
			t.max = max(t.max, id)
		}
	})
	if len(t.toks) == 0 || int(t.max) < vocab {
		return nil
	}
	for i, id := range t.toks {
		if int(id) >= vocab {
			return &VocabError{File: t.name, Offset: i, ID: int(id), VocabSize: vocab}
		}
	}
	return nil // not reached: t.max is one of t.toks, and t.max >= vocab
}

// VocabError is a token id outside the model's vocabulary.
type VocabError struct {
	File      string
	Offset    int // in tokens; the byte offset in the file is twice this
	ID        int
	VocabSize int
}

// Error names the file, the offset and the id, and says what to do.
func (e *VocabError) Error() string {
	return fmt.Sprintf("data: %s: token %d at offset %d (byte %d) is not below the vocabulary size %d: the file was prepared with another tokenizer; prepare it again or use a model with a larger vocabulary",
		e.File, e.ID, e.Offset, 2*e.Offset, e.VocabSize)
}
