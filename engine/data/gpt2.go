package data

import (
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer/codec"
)

// GPT-2's byte-level BPE: tiktoken's "gpt2" encoding (r50k_base), the one
// nanoGPT's prepare.py and llm.c use. Its 50,256 ranks are embedded in
// github.com/tiktoken-go/tokenizer (a Go port of tiktoken) and its
// pre-tokenizer, the regular expression
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// with its lookahead (which Go's regexp lacks), runs on regexp2's engine,
// compiled to Go code: nothing is downloaded at run time.
const (
	// GPT2VocabSize is GPT-2's vocabulary: 50,256 merges' tokens and
	// <|endoftext|>.
	GPT2VocabSize = 50257
	// GPT2EOT is <|endoftext|>.
	GPT2EOT = 50256
)

// gpt2Tokenizer is the GPT-2 tokenizer; GPT2 returns the one instance.
type gpt2Tokenizer struct {
	codec  *codec.Codec
	pieces [][]byte          // id → its bytes, below GPT2EOT
	byByte [256]uint16       // the id of each single byte
	ranks  map[string]uint16 // bytes → id, for the merges of hf.go
}

// GPT2 returns GPT-2's tokenizer. The first call builds its tables (about
// 50 ms); it is safe for concurrent use.
func GPT2() Tokenizer { return gpt2Once() }

var gpt2Once = sync.OnceValue(func() *gpt2Tokenizer {
	g := &gpt2Tokenizer{codec: codec.NewR50kBase(), pieces: make([][]byte, GPT2EOT), ranks: make(map[string]uint16, GPT2EOT)}
	ids := make([]uint, 1)
	for id := range GPT2EOT {
		ids[0] = uint(id)
		// The codec's default error mode returns a token's bytes as they
		// are, UTF-8 or not. Every id below GPT2EOT has a token: the tests
		// check the table against tiktoken's file.
		s, err := g.codec.Decode(ids)
		if err != nil {
			panic(fmt.Sprintf("data: the embedded GPT-2 ranks lack id %d: %v", id, err))
		}
		g.pieces[id] = []byte(s)
		g.ranks[s] = uint16(id)
		if len(s) == 1 {
			g.byByte[s[0]] = uint16(id)
		}
	}
	return g
})

func (g *gpt2Tokenizer) Name() string   { return TokenizerGPT2 }
func (g *gpt2Tokenizer) VocabSize() int { return GPT2VocabSize }
func (g *gpt2Tokenizer) EOT() int       { return GPT2EOT }

// AppendEncode is tiktoken's encode_ordinary on valid UTF-8. A byte that
// is not part of valid UTF-8 (which tiktoken's str cannot hold) becomes its
// own single-byte token, so that every byte string round-trips, as a
// byte-level BPE promises.
func (g *gpt2Tokenizer) AppendEncode(dst []uint16, text []byte) []uint16 {
	for len(text) > 0 {
		n := validPrefix(text)
		if n > 0 {
			dst = g.appendValid(dst, string(text[:n]))
			text = text[n:]
			continue
		}
		dst = append(dst, g.byByte[text[0]])
		text = text[1:]
	}
	return dst
}

// validPrefix is the length of the longest valid UTF-8 prefix of b.
func validPrefix(b []byte) int {
	if utf8.Valid(b) {
		return len(b)
	}
	i := 0
	for i < len(b) {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			break
		}
		i += n
	}
	return i
}

// del is U+007F, which the codec's compiled expression (regexp2cg's
// bitmap of [^\s\p{L}\p{N}] for ASCII lacks bit 127) matches with no
// alternative and so drops. appendValid encodes the pieces that hold one
// itself; every other character goes through the codec.
const del = 0x7f

// appendValid encodes valid UTF-8: the codec's tokens, but for the pieces
// that hold a DEL. Such a piece is ` ?[^\s\p{L}\p{N}]+`: the run of
// characters that are neither space, letter nor number around the DEL,
// with the space before it (a space before such a run always starts its
// piece). No GPT-2 token of two or more bytes holds a DEL (a test checks),
// so BPE merges nothing across one: the piece's tokens are those of its
// parts between DELs, each a piece of its own for the codec, and a DEL
// token for each DEL.
func (g *gpt2Tokenizer) appendValid(dst []uint16, s string) []uint16 {
	for {
		i := strings.IndexByte(s, del)
		if i < 0 {
			return g.appendCodec(dst, s)
		}
		start, end := i, i+1
		for start > 0 {
			r, n := utf8.DecodeLastRuneInString(s[:start])
			if !isOther(r) {
				break
			}
			start -= n
		}
		// A whitespace run before the piece ends with a piece of its own
		// last character ("\s+(?!\S)" backs off one before a non-space),
		// but at the end of s[:start] would be one piece: encode it apart.
		split := start
		if start > 0 && s[start-1] == ' ' {
			start--
			split = start
		} else if r, n := utf8.DecodeLastRuneInString(s[:start]); n > 0 && unicode.IsSpace(r) {
			split = start - n
		}
		for end < len(s) {
			r, n := utf8.DecodeRuneInString(s[end:])
			if !isOther(r) {
				break
			}
			end += n
		}
		dst = g.appendCodec(dst, s[:split])
		dst = g.appendCodec(dst, s[split:start])
		for j, part := range strings.Split(s[start:end], string(rune(del))) {
			if j > 0 {
				dst = append(dst, g.byByte[del])
			}
			dst = g.appendCodec(dst, part)
		}
		s = s[end:]
	}
}

// isOther is [^\s\p{L}\p{N}], as the pre-tokenizer (tiktoken's Rust
// regex: \s is Unicode White_Space) classes r.
func isOther(r rune) bool { return !unicode.IsSpace(r) && !unicode.IsLetter(r) && !unicode.IsNumber(r) }

// appendCodec encodes valid UTF-8 without a DEL with the codec.
func (g *gpt2Tokenizer) appendCodec(dst []uint16, s string) []uint16 {
	if s == "" {
		return dst
	}
	ids, _, err := g.codec.Encode(s)
	if err != nil {
		// The compiled expression has no match timeout and the input is
		// valid UTF-8: the codec cannot fail. Should it, bytes still
		// round-trip.
		for i := range len(s) {
			dst = append(dst, g.byByte[s[i]])
		}
		return dst
	}
	for _, id := range ids {
		dst = append(dst, uint16(id))
	}
	return dst
}

// Decode concatenates the tokens' bytes.
func (g *gpt2Tokenizer) Decode(toks []uint16) string {
	var b strings.Builder
	for _, t := range toks {
		switch {
		case int(t) < GPT2EOT:
			b.Write(g.pieces[t])
		case t == GPT2EOT:
			b.WriteString(EOTMarker)
		default:
			b.WriteString("\uFFFD")
		}
	}
	return b.String()
}

// maxPending bounds the text a streamEncoder holds back while it looks for
// a place to cut that cannot change the encoding; 16 MiB of one line
// without a space between words is cut anyway, at a character.
const maxPending = 16 << 20

// streamEncoder encodes a document that arrives in chunks, a file too large
// to read at once, exactly as if it were encoded whole: it encodes up to
// the last place where the pre-tokenizer always splits (safeCut) and keeps
// the rest for the next chunk.
type streamEncoder struct {
	tok     Tokenizer
	pending []byte
	out     []uint16
}

// write adds p to the document and returns the tokens now certain, valid
// until the next call.
func (s *streamEncoder) write(p []byte) []uint16 {
	s.pending = append(s.pending, p...)
	cut := safeCut(s.pending)
	if cut == 0 && len(s.pending) >= maxPending {
		cut = len(s.pending) - 1
		for cut > 0 && !utf8.RuneStart(s.pending[cut]) {
			cut--
		}
	}
	s.out = s.tok.AppendEncode(s.out[:0], s.pending[:cut])
	s.pending = append(s.pending[:0], s.pending[cut:]...)
	return s.out
}

// flush ends the document and returns its last tokens.
func (s *streamEncoder) flush() []uint16 {
	s.out = s.tok.AppendEncode(s.out[:0], s.pending)
	s.pending = s.pending[:0]
	return s.out
}

// safeCut is the last index i of b at which GPT-2's pre-tokenizer splits
// whatever comes before and after, so that encoding b[:i] and b[i:] apart
// gives the tokens of b; 0 when there is none. Two places qualify, found
// from the pattern's alternatives:
//
//   - x␠y with x printable ASCII other than space and y an ASCII letter,
//     cut before the space: the piece holding x ends at x (no alternative
//     takes a space after a non-space), and " ?\p{L}+" starts at the space
//     whatever precedes it;
//   - x\ny with x and y printable ASCII other than space, cut after the
//     newline: the newline is a whitespace run of its own, the same at the
//     end of b[:i] as before y.
//
// A cut next to other whitespace could move a space between pieces
// ("\s+(?!\S)" looks ahead), so none is made there.
func safeCut(b []byte) int {
	for i := len(b) - 2; i >= 1; i-- {
		switch {
		case b[i] == ' ' && isGraphicASCII(b[i-1]) && isLetterASCII(b[i+1]):
			return i
		case b[i] == '\n' && isGraphicASCII(b[i-1]) && isGraphicASCII(b[i+1]):
			return i + 1
		}
	}
	return 0
}

func isGraphicASCII(c byte) bool { return c > ' ' && c < 0x7f }
func isLetterASCII(c byte) bool  { return c|0x20 >= 'a' && c|0x20 <= 'z' }
