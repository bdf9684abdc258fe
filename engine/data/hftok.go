package data

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
)

// The files Hugging Face's GPT2Tokenizer (and GPT2TokenizerFast, which
// converts them) reads from a model directory.
const (
	HFVocabFile           = "vocab.json"
	HFMergesFile          = "merges.txt"
	HFTokenizerConfigFile = "tokenizer_config.json"
)

// byteToUnicode is GPT-2's bytes_to_unicode (encoder.py): the printable
// bytes ! to ~, ¡ to ¬ and ® to ÿ stand for themselves, the other 68 for
// U+0100 onwards in byte order, so that a token's bytes are a string of
// visible characters (a space is Ġ, U+0120).
var byteToUnicode = sync.OnceValue(func() [256]rune {
	var m [256]rune
	printable := func(b int) bool { return b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF }
	n := 0
	for b := range 256 {
		if printable(b) {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
})

// hfString is a token's bytes as vocab.json and merges.txt spell them.
func hfString(b []byte) string {
	m := byteToUnicode()
	var s strings.Builder
	for _, c := range b {
		s.WriteRune(m[c])
	}
	return s.String()
}

// WriteGPT2Vocab writes vocab.json: every token, spelled by hfString, and
// <|endoftext|>, to its id, in id order.
func WriteGPT2Vocab(w io.Writer) error {
	g := gpt2Once()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "<|endoftext|>" as GPT-2's file has it
	b.WriteByte('{')
	for id, p := range g.pieces {
		if err := enc.Encode(hfString(p)); err != nil {
			return err
		}
		b.Truncate(b.Len() - 1) // Encode's newline
		fmt.Fprintf(&b, ": %d, ", id)
	}
	fmt.Fprintf(&b, "%q: %d}", EOTMarker, GPT2EOT)
	_, err := w.Write(b.Bytes())
	return err
}

// WriteGPT2Merges writes merges.txt: "#version: 0.2", then the merge that
// makes each token of id 256 onwards, in id order (a merge's line is its
// priority). tiktoken keeps only the ranks; the merge of token r is the
// split of its bytes that BPE with the merges below r ends at, which is
// how GPT-2's ranks were made from its merges.
func WriteGPT2Merges(w io.Writer) error {
	g := gpt2Once()
	var b bytes.Buffer
	b.WriteString("#version: 0.2\n")
	for id := 256; id < GPT2EOT; id++ {
		l, r, err := g.mergeOf(id)
		if err != nil {
			return err
		}
		b.WriteString(hfString(l))
		b.WriteByte(' ')
		b.WriteString(hfString(r))
		b.WriteByte('\n')
	}
	_, err := w.Write(b.Bytes())
	return err
}

// mergeOf is the pair of tokens whose merge makes token id: BPE on its
// bytes with only the ranks below id.
func (g *gpt2Tokenizer) mergeOf(id int) (left, right []byte, err error) {
	tok := g.pieces[id]
	parts := make([][]byte, len(tok))
	for i := range tok {
		parts[i] = tok[i : i+1]
	}
	for len(parts) > 2 {
		best, bestRank := -1, id
		for i := range len(parts) - 1 {
			pair := tok[offsetOf(tok, parts[i]) : offsetOf(tok, parts[i+1])+len(parts[i+1])]
			if r, ok := g.ranks[string(pair)]; ok && int(r) < bestRank {
				best, bestRank = i, int(r)
			}
		}
		if best < 0 {
			break
		}
		start := offsetOf(tok, parts[best])
		parts[best] = tok[start : start+len(parts[best])+len(parts[best+1])]
		parts = append(parts[:best+1], parts[best+2:]...)
	}
	if len(parts) != 2 {
		return nil, nil, fmt.Errorf("data: GPT-2 token %d (%q) is made by no single merge of lower ranks", id, tok)
	}
	return parts[0], parts[1], nil
}

// offsetOf is where part, a subslice of tok, starts in it.
func offsetOf(tok, part []byte) int { return cap(tok) - cap(part) }

// WriteGPT2TokenizerFiles writes vocab.json, merges.txt and
// tokenizer_config.json into dir, each atomically (replacing only regular
// files): what GPT2Tokenizer.from_pretrained(dir) reads. maxLen is the
// model's context, the tokenizer's model_max_length.
func WriteGPT2TokenizerFiles(dir string, maxLen int) ([]string, error) {
	cfg := map[string]any{
		"model_max_length": maxLen,
		"tokenizer_class":  "GPT2Tokenizer",
		"bos_token":        EOTMarker,
		"eos_token":        EOTMarker,
		"unk_token":        EOTMarker,
		"add_prefix_space": false,
	}
	files := []struct {
		name  string
		write func(io.Writer) error
	}{
		{HFVocabFile, WriteGPT2Vocab},
		{HFMergesFile, WriteGPT2Merges},
		{HFTokenizerConfigFile, func(w io.Writer) error {
			b, err := json.MarshalIndent(cfg, "", "  ")
			if err == nil {
				_, err = w.Write(append(b, '\n'))
			}
			return err
		}},
	}
	var written []string
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		if err := writeAtomic(path, f.write); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	return written, nil
}
