package data

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestWriteFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "train.bin")
	want := []uint16{EOT, 'h', 'i', 65535, 0}
	if err := WriteFile(path, want); err != nil {
		t.Fatal(err)
	}
	tok, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	if got := readAll(t, tok); !slices.Equal(got, want) {
		t.Fatalf("read back %v, want %v", got, want)
	}
}

func TestTokenWriterLargeAndBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.bin")
	w, err := CreateTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	text := []byte(strings.Repeat("abcdefgh", 3000)) // more than one buffer
	want := AppendBytes(nil, text)
	if err := w.WriteTokens([]uint16{EOT}); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteByteTokens(text); err != nil {
		t.Fatal(err)
	}
	if w.Len() != int64(len(want)) {
		t.Fatalf("Len = %d, want %d", w.Len(), len(want))
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(b, le(want...)) {
		t.Fatal("file differs from the tokens written")
	}
}

// TestTokenWriterAtomic: until Commit the destination keeps its old
// content, and an aborted writer leaves nothing behind.
func TestTokenWriterAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "train.bin")
	if err := WriteFile(path, []uint16{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	w, err := CreateTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTokens(make([]uint16, 10000)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 6 {
		t.Fatalf("before Commit: stat = %v, %v; want the old 6 bytes", fi, err)
	}
	w.Abort()
	w.Abort()
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "train.bin" {
		t.Fatalf("after Abort the directory holds %v, want only train.bin", entries)
	}
	if err := w.Commit(); err == nil {
		t.Error("Commit after Abort succeeded")
	}
}

func TestCreateTokensErrorNamesPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing-dir", "train.bin")
	_, err := CreateTokens(path)
	if err == nil || !strings.Contains(err.Error(), "data: create "+path+": ") {
		t.Fatalf("CreateTokens = %v, want an error naming %s", err, path)
	}
}
