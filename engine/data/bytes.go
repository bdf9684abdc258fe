package data

import "strings"

// The built-in byte-level tokenizer: every byte is its own token, and EOT
// marks the start of each document, as GPT-2's <|endoftext|> does in
// nanoGPT's and llm.c's prepared data.
const (
	// TokenizerBytes is the tokenizer's name in meta.json.
	TokenizerBytes = "bytes"
	// EOT is the end-of-text token, put before each document.
	EOT = 256
	// ByteVocabSize is the vocabulary size: bytes 0-255 and EOT.
	ByteVocabSize = 257
	// EOTMarker is how Decode renders EOT, GPT-2's spelling.
	EOTMarker = "<|endoftext|>"
)

// EncodeBytes tokenizes one document: EOT, then one token per byte.
func EncodeBytes(doc []byte) []uint16 {
	return AppendBytes(make([]uint16, 0, len(doc)+1), doc)
}

// AppendBytes appends the tokens of one document (EOT, then its bytes) to
// dst and returns the extended slice.
func AppendBytes(dst []uint16, doc []byte) []uint16 {
	dst = append(dst, EOT)
	for _, b := range doc {
		dst = append(dst, uint16(b))
	}
	return dst
}

// Decode turns byte-level tokens back into text: a byte token is its byte,
// EOT is EOTMarker, and an id outside the vocabulary (which a model with a
// larger, padded vocabulary may sample) is U+FFFD. The bytes of a document
// are returned as they were, valid UTF-8 or not.
func Decode(toks []uint16) string {
	var b strings.Builder
	b.Grow(len(toks))
	for _, t := range toks {
		switch {
		case t < EOT:
			b.WriteByte(byte(t))
		case t == EOT:
			b.WriteString(EOTMarker)
		default:
			b.WriteString("\uFFFD")
		}
	}
	return b.String()
}
