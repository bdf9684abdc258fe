package data

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeRaw writes b as the file name in a temporary directory.
func writeRaw(t *testing.T, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// le encodes toks in the .bin layout.
func le(toks ...uint16) []byte {
	b := make([]byte, 2*len(toks))
	for i, t := range toks {
		binary.LittleEndian.PutUint16(b[2*i:], t)
	}
	return b
}

// readAll is every token of tok.
func readAll(t *testing.T, tok *Tokens) []uint16 {
	t.Helper()
	all := make([]uint16, tok.Len())
	if err := tok.Copy(all, 0); err != nil {
		t.Fatal(err)
	}
	return all
}

func TestOpenMapsFile(t *testing.T) {
	want := []uint16{0, 1, 256, 50256, 65535, 7}
	path := writeRaw(t, "train.bin", le(want...))
	tok, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if tok.mapped == nil && nativeLittleEndian {
		t.Error("Open read the file; want it mapped")
	}
	if tok.Len() != len(want) || tok.Name() != path {
		t.Fatalf("Len, Name = %d, %q; want %d, %q", tok.Len(), tok.Name(), len(want), path)
	}
	if got := readAll(t, tok); !slices.Equal(got, want) {
		t.Errorf("Copy of all = %v, want %v", got, want)
	}
	got := make([]uint16, 2)
	if err := tok.Copy(got, 2); err != nil || got[0] != 256 || got[1] != 50256 {
		t.Errorf("Copy at 2 = %v, %v", got, err)
	}
	if err := tok.Copy(got, 5); err == nil {
		t.Error("Copy past the end succeeded")
	}
	if err := tok.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tok.Close(); err != nil || tok.Len() != 0 {
		t.Errorf("second Close = %v, Len = %d; want nil, 0", err, tok.Len())
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.bin")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		path string
		want string
	}{
		{"missing", filepath.Join(dir, "nope.bin"), "nope.bin: no such file"},
		{"empty", writeRaw(t, "empty.bin", nil), "empty.bin: empty"},
		{"odd length", writeRaw(t, "odd.bin", []byte{1, 2, 3}), "odd.bin: 3 bytes is not a whole number of uint16 tokens"},
		{"directory", dir, "not a regular file"},
		{"fifo without a writer", fifo, "fifo.bin: not a regular file"}, // not a blocked open
		{"endless device", "/dev/zero", "/dev/zero: not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tok *Tokens
			var err error
			done := make(chan struct{})
			go func() { defer close(done); tok, err = Open(tt.path) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second): // a backstop: Open must not block at all
				t.Fatalf("Open(%s) blocked", tt.path)
			}
			if err == nil {
				tok.Close()
				t.Fatal("Open succeeded, want an error")
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "data: ") || !strings.Contains(msg, tt.want) {
				t.Errorf("error %q, want it to start with \"data: \" and contain %q", msg, tt.want)
			}
		})
	}
}

func TestCheckVocab(t *testing.T) {
	tests := []struct {
		name  string
		toks  []uint16
		vocab int
		want  string // "" for no error
	}{
		{"all below", []uint16{0, 255, 256}, 257, ""},
		{"empty", nil, 257, ""},
		{"first bad named", []uint16{1, 300, 2, 400}, 257, "token 300 at offset 1 (byte 2) is not below the vocabulary size 257"},
		{"equal to vocab", []uint16{5, 257}, 257, "token 257 at offset 1"},
		{"bad vocab", []uint16{1}, 0, "vocabulary size 0: must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := NewTokens(tt.toks).CheckVocab(tt.vocab)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("CheckVocab = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "memory") {
				t.Fatalf("CheckVocab = %v, want an error naming memory and containing %q", err, tt.want)
			}
		})
	}
}

func TestCheckVocabNamesFile(t *testing.T) {
	path := writeRaw(t, "gpt2.bin", le(10, 20, 50256))
	tok, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	if err := tok.CheckVocab(50257); err != nil {
		t.Fatalf("CheckVocab(50257) = %v", err)
	}
	err = tok.CheckVocab(ByteVocabSize)
	var ve *VocabError
	if !errors.As(err, &ve) || ve.File != path || ve.Offset != 2 || ve.ID != 50256 {
		t.Fatalf("CheckVocab(257) = %#v, want a VocabError for %s offset 2 id 50256", err, path)
	}
}

// FuzzOpen: any file either fails to open with an error or opens as exactly
// its little-endian uint16s.
func FuzzOpen(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add(le(0, 256, 65535))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := writeRaw(t, "f.bin", b)
		tok, err := Open(path)
		if err != nil {
			if len(b) != 0 && len(b)%2 == 0 {
				t.Fatalf("Open(%d bytes) = %v", len(b), err)
			}
			return
		}
		defer tok.Close()
		if tok.Len() != len(b)/2 {
			t.Fatalf("Len = %d for %d bytes", tok.Len(), len(b))
		}
		for i, got := range readAll(t, tok) {
			if got != binary.LittleEndian.Uint16(b[2*i:]) {
				t.Fatalf("token %d = %d, want %d", i, got, binary.LittleEndian.Uint16(b[2*i:]))
			}
		}
		_ = tok.CheckVocab(ByteVocabSize)
	})
}
