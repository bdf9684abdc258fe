package data

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/userfile"
)

func TestMetaRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), MetaFile)
	want := Meta{Tokenizer: TokenizerBytes, VocabSize: ByteVocabSize, EOT: EOT, TrainTokens: 90, ValTokens: 10, Sources: []string{"a.txt"}}
	if err := WriteMeta(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMeta(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadMeta = %+v, want %+v", got, want)
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), `"vocab_size": 257`) {
		t.Errorf("meta.json lacks vocab_size:\n%s", b)
	}
}

func TestReadMetaErrors(t *testing.T) {
	tests := []struct {
		name, json, want string
	}{
		{"not json", "{", "not a data meta.json"},
		{"no tokenizer", `{"vocab_size": 257}`, "no tokenizer"},
		{"vocab too large", `{"tokenizer":"x","vocab_size":70000}`, "vocab_size 70000"},
		{"eot outside", `{"tokenizer":"bytes","vocab_size":257,"eot":257}`, "eot 257"},
		{"negative count", `{"tokenizer":"bytes","vocab_size":257,"eot":256,"train_tokens":-1}`, "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeRaw(t, "meta.json", []byte(tt.json))
			_, err := ReadMeta(path)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadMeta = %v, want an error naming %s and containing %q", err, path, tt.want)
			}
		})
	}
	if _, err := ReadMeta(filepath.Join(t.TempDir(), "none.json")); err == nil || !strings.Contains(err.Error(), "none.json") {
		t.Errorf("ReadMeta(missing) = %v, want an error naming the file", err)
	}
}

// FuzzReadMeta: any meta.json is read or rejected, never a panic, and what
// is read passes the checks.
func FuzzReadMeta(f *testing.F) {
	f.Add([]byte(`{"tokenizer":"bytes","vocab_size":257,"eot":256,"train_tokens":9,"val_tokens":1,"sources":["a"]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ReadMeta(writeRaw(t, "meta.json", b))
		if err == nil && m.check() != nil {
			t.Fatalf("ReadMeta accepted %+v", m)
		}
	})
}

// TestReadMetaBounded: a meta.json over MaxMetaSize (a sparse file, so
// nothing is written) is refused unread, naming the file and the limit; a
// FIFO without a writer or /dev/zero in its place is refused at once
// instead of blocking the open or being read without end.
func TestReadMetaBounded(t *testing.T) {
	dir := t.TempDir()
	big, fifo := filepath.Join(dir, "big.json"), filepath.Join(dir, "fifo.json")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxMetaSize + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ path, want string }{
		{big, big + ": larger than 256 MiB, the limit for this file"},
		{fifo, fifo + ": not a regular file"},
		{"/dev/zero", "/dev/zero: not a regular file"},
	} {
		done := make(chan error, 1)
		go func() { _, err := ReadMeta(tt.path); done <- err }()
		select {
		case err := <-done:
			var ue *userfile.Error
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ReadMeta(%s) = %v, want a *userfile.Error saying %q", tt.path, err, tt.want)
			}
		case <-time.After(30 * time.Second): // a backstop: it must not block at all
			t.Fatalf("ReadMeta(%s) blocked", tt.path)
		}
	}
}

// TestWriteMetaBounded: WriteMeta refuses a meta.json that ReadMeta would
// refuse (here with a limit of 1 KiB), leaving no file; one at the limit is
// written and read back.
func TestWriteMetaBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), MetaFile)
	m := Meta{Tokenizer: TokenizerBytes, VocabSize: ByteVocabSize, EOT: EOT, Sources: []string{strings.Repeat("x", 1024)}}
	if err := writeMeta(path, m, 1024); err == nil || !strings.Contains(err.Error(), "over the 1 KiB a meta.json may have") {
		t.Fatalf("writeMeta = %v, want it refused", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after a refused write: %v", path, err)
	}
	m.Sources[0] = "a.txt"
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := writeMeta(path, m, len(b)+1); err != nil {
		t.Fatalf("writeMeta at the limit: %v", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != int64(len(b)+1) {
		t.Fatalf("meta.json at the limit: %v, %v; want %d bytes", fi, err, len(b)+1)
	}
	if _, err := ReadMeta(path); err != nil {
		t.Errorf("ReadMeta of what WriteMeta wrote: %v", err)
	}
}
