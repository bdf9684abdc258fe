package data

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// readBin reads a .bin file as nanoGPT does (np.memmap(dtype=np.uint16)):
// little-endian uint16, no header.
func readBin(t *testing.T, path string) []uint16 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b)%2 != 0 {
		t.Fatalf("%s: %d bytes, not whole uint16s", path, len(b))
	}
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

// TestPrepareGPT2Documents: with --tokenizer gpt2 each document is EOT
// (50256) and its BPE tokens in nanoGPT's .bin layout, the last documents
// in val.bin, and meta.json records the encoding and its vocabulary.
func TestPrepareGPT2Documents(t *testing.T) {
	dir := t.TempDir()
	docs := map[string]string{"a.txt": "hello world", "b.txt": "0000000000000000\n"}
	for name, text := range docs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "out")
	rep, err := Prepare(context.Background(), PrepareConfig{Inputs: []string{dir}, Out: out, ValFraction: 0.1, Tokenizer: TokenizerGPT2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := readBin(t, filepath.Join(out, TrainFile)), []uint16{50256, 31373, 995}; !slices.Equal(got, want) {
		t.Errorf("train.bin = %v, want %v (EOT, then tiktoken's ids of hello world)", got, want)
	}
	if got, want := readBin(t, filepath.Join(out, ValFile)), []uint16{50256, 25645, 198}; !slices.Equal(got, want) {
		t.Errorf("val.bin = %v, want %v", got, want)
	}
	meta, err := ReadMeta(filepath.Join(out, MetaFile))
	if err != nil {
		t.Fatal(err)
	}
	want := Meta{Tokenizer: "gpt2", VocabSize: 50257, EOT: 50256, TrainTokens: 3, ValTokens: 3}
	if meta.Tokenizer != want.Tokenizer || meta.VocabSize != want.VocabSize || meta.EOT != want.EOT ||
		meta.TrainTokens != want.TrainTokens || meta.ValTokens != want.ValTokens || rep.Meta.Tokenizer != "gpt2" {
		t.Errorf("meta.json = %+v, want %+v", meta, want)
	}
}

// TestPrepareGPT2OneDocument: a single document larger than a read is split
// at a byte into train and val, each part encoded apart (nanoGPT's
// prepare.py); the parts decode back to the document.
func TestPrepareGPT2OneDocument(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := 0; b.Len() < 3<<20; i++ {
		b.WriteString("It's the cat, number 42!  The river\n\nhears an old ship. ")
	}
	doc := b.String()
	in := filepath.Join(dir, "one.txt")
	if err := os.WriteFile(in, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if _, err := Prepare(context.Background(), PrepareConfig{Inputs: []string{in}, Out: out, ValFraction: 0.1, Tokenizer: TokenizerGPT2}, nil); err != nil {
		t.Fatal(err)
	}
	train, val := readBin(t, filepath.Join(out, TrainFile)), readBin(t, filepath.Join(out, ValFile))
	if len(train) < 2 || len(val) < 1 || train[0] != GPT2EOT {
		t.Fatalf("train.bin %d tokens (first %v), val.bin %d: want EOT first and both non-empty", len(train), train[:min(1, len(train))], len(val))
	}
	cut := len(doc) - int(valCount(0.1, int64(len(doc))))
	if got := GPT2().Decode(train[1:]); got != doc[:cut] {
		t.Errorf("train.bin decodes to %d bytes, want the document's first %d", len(got), cut)
	}
	if got := GPT2().Decode(val); got != doc[cut:] {
		t.Errorf("val.bin decodes to %d bytes, want the document's last %d", len(got), len(doc)-cut)
	}
	whole := gpt2Encode(doc[:cut])
	if !slices.Equal(train[1:], whole) {
		t.Errorf("train.bin's tokens differ from encoding its text at once: read in chunks, it must not")
	}
}

// TestCheckModelVocab: a job whose model vocabulary is smaller than the
// meta.json's is refused with what to set; enough, or no meta.json, passes.
func TestCheckModelVocab(t *testing.T) {
	dir := t.TempDir()
	train := filepath.Join(dir, TrainFile)
	if err := CheckModelVocab(train, 257); err != nil {
		t.Errorf("without meta.json: %v", err)
	}
	if err := WriteMeta(filepath.Join(dir, MetaFile), Meta{Tokenizer: "gpt2", VocabSize: 50257, EOT: 50256}); err != nil {
		t.Fatal(err)
	}
	err := CheckModelVocab(train, 257)
	if err == nil || !strings.Contains(err.Error(), "prepared with the gpt2 tokenizer (vocabulary 50257") || !strings.Contains(err.Error(), "set model.vocab to at least 50257") {
		t.Errorf("vocab 257 on gpt2 data: %v", err)
	}
	for _, v := range []int{50257, 50304} {
		if err := CheckModelVocab(train, v); err != nil {
			t.Errorf("vocab %d: %v", v, err)
		}
	}
}
