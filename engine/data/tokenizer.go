package data

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// Tokenizer turns text into token ids and back. Both of gtrain's tokenizers
// are byte-level: every byte string has an encoding, and decoding it gives
// the bytes back.
type Tokenizer interface {
	// Name is the tokenizer's name in meta.json: "bytes" or "gpt2".
	Name() string
	// VocabSize is the number of ids the tokenizer uses; every id it
	// encodes to is below it.
	VocabSize() int
	// EOT is the end-of-text id, put before each document.
	EOT() int
	// AppendEncode appends the tokens of text, which holds no special
	// tokens (EOTMarker is text like any other), to dst.
	AppendEncode(dst []uint16, text []byte) []uint16
	// Decode turns tokens into text: EOT is EOTMarker, an id at or above
	// VocabSize U+FFFD. The bytes come back as they were, valid UTF-8 or
	// not.
	Decode(toks []uint16) string
}

// Tokenizer names, as meta.json and --tokenizer spell them.
const (
	TokenizerGPT2 = "gpt2"
)

// TokenizerNames lists the tokenizers NewTokenizer knows.
var TokenizerNames = []string{TokenizerBytes, TokenizerGPT2}

// NewTokenizer returns the tokenizer called name ("bytes" or "gpt2").
func NewTokenizer(name string) (Tokenizer, error) {
	switch name {
	case TokenizerBytes:
		return bytesTokenizer{}, nil
	case TokenizerGPT2, "r50k_base":
		return GPT2(), nil
	}
	return nil, fmt.Errorf("data: tokenizer %q: want one of %s", name, strings.Join(TokenizerNames, ", "))
}

// bytesTokenizer is the byte-level tokenizer of bytes.go.
type bytesTokenizer struct{}

func (bytesTokenizer) Name() string                { return TokenizerBytes }
func (bytesTokenizer) VocabSize() int              { return ByteVocabSize }
func (bytesTokenizer) EOT() int                    { return EOT }
func (bytesTokenizer) Decode(toks []uint16) string { return Decode(toks) }
func (bytesTokenizer) AppendEncode(dst []uint16, text []byte) []uint16 {
	for _, b := range text {
		dst = append(dst, uint16(b))
	}
	return dst
}

// EncodePrompt encodes a prompt for tok, where EOTMarker, as nanoGPT's
// sample.py allows it, stands for the EOT token.
func EncodePrompt(tok Tokenizer, prompt string) []uint16 {
	var out []uint16
	for i, part := range strings.Split(prompt, EOTMarker) {
		if i > 0 {
			out = append(out, uint16(tok.EOT()))
		}
		out = tok.AppendEncode(out, []byte(part))
	}
	return out
}

// RunTokenizer is the tokenizer the data of a run was prepared with: the
// one the meta.json beside train (the job's data.train) names; the
// byte-level one for the synthetic corpus (train empty). Without a
// meta.json it guesses from the model's vocabulary (at least GPT-2's: gpt2,
// else bytes) and says so in note.
func RunTokenizer(train string, vocab int) (tok Tokenizer, note string, err error) {
	if train == "" {
		return bytesTokenizer{}, "", nil
	}
	metaPath := filepath.Join(filepath.Dir(train), MetaFile)
	m, err := ReadMeta(metaPath)
	switch {
	case err == nil:
		tok, err := NewTokenizer(m.Tokenizer)
		if err != nil {
			return nil, "", fmt.Errorf("data: %s: %w", metaPath, err)
		}
		return tok, "", nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, "", err
	}
	tok = bytesTokenizer{}
	if vocab >= GPT2VocabSize {
		tok = GPT2()
	}
	return tok, fmt.Sprintf("no %s beside %s: taking the %s tokenizer for a vocabulary of %d (give --tokenizer to choose)",
		MetaFile, train, tok.Name(), vocab), nil
}

// CheckModelVocab refuses a model whose vocabulary is smaller than that of
// the tokenizer that prepared train, the token file a job trains on, as the
// meta.json beside it says; a file without one is not checked (the scan
// of CheckVocab still is). It runs before the file is read, so a job on
// GPT-2 tokens with a byte-level model stops with what to set.
func CheckModelVocab(train string, vocab int) error {
	metaPath := filepath.Join(filepath.Dir(train), MetaFile)
	m, err := ReadMeta(metaPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if vocab < m.VocabSize {
		return fmt.Errorf("data: %s was prepared with the %s tokenizer (vocabulary %d, says %s): model.vocab %d is too small; set model.vocab to at least %d (nanoGPT pads GPT-2's to 50304) or use a gpt2 preset",
			train, m.Tokenizer, m.VocabSize, metaPath, vocab, m.VocabSize)
	}
	return nil
}
