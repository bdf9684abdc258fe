package data

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
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
