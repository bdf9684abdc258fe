package data

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func gpt2Encode(s string) []uint16 { return GPT2().AppendEncode(nil, []byte(s)) }

// TestGPT2TiktokenVectors: the ids of tiktoken's own tests for the gpt2 and
// r50k_base encodings (tests/test_encoding.py: test_simple,
// test_simple_repeated, test_basic_encode, test_encode_empty).
func TestGPT2TiktokenVectors(t *testing.T) {
	tests := []struct {
		text string
		want []uint16
	}{
		{"hello world", []uint16{31373, 995}},
		{"", nil},
		{"0", []uint16{15}},
		{"00", []uint16{405}},
		{"000", []uint16{830}},
		{"0000", []uint16{2388}},
		{"00000", []uint16{20483}},
		{"000000", []uint16{10535}},
		{"0000000", []uint16{24598}},
		{"00000000", []uint16{8269}},
		{"000000000", []uint16{10535, 830}},
		{"0000000000", []uint16{8269, 405}},
		{"00000000000", []uint16{8269, 830}},
		{"000000000000", []uint16{8269, 2388}},
		{"0000000000000", []uint16{8269, 20483}},
		{"00000000000000", []uint16{8269, 10535}},
		{"000000000000000", []uint16{8269, 24598}},
		{"0000000000000000", []uint16{25645}},
		{"00000000000000000", []uint16{8269, 10535, 830}},
	}
	for _, tt := range tests {
		if got := gpt2Encode(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
	if got := GPT2().Decode([]uint16{31373, 995}); got != "hello world" {
		t.Errorf("decode([31373 995]) = %q, want hello world", got)
	}
	// encode("hello <|endoftext|>", allowed_special="all"), as sample.py
	// encodes a prompt.
	if got, want := EncodePrompt(GPT2(), "hello <|endoftext|>"), []uint16{31373, 220, 50256}; !slices.Equal(got, want) {
		t.Errorf("EncodePrompt(hello <|endoftext|>) = %v, want %v", got, want)
	}
}

// TestGPT2RanksAreTiktokens: the embedded ranks, written out as tiktoken's
// r50k_base.tiktoken file (base64 of a token's bytes, space, rank; rank
// order), have the SHA-256 tiktoken pins for that file: every one of the
// 50,256 tokens is there, with its rank, and nothing else.
func TestGPT2RanksAreTiktokens(t *testing.T) {
	g := gpt2Once()
	if len(g.ranks) != GPT2EOT {
		t.Fatalf("%d distinct tokens, want %d", len(g.ranks), GPT2EOT)
	}
	var b bytes.Buffer
	for id, p := range g.pieces {
		b.WriteString(base64.StdEncoding.EncodeToString(p))
		b.WriteString(" " + strconv.Itoa(id) + "\n")
	}
	const want = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930" // tiktoken_ext/openai_public.py
	sum := sha256.Sum256(b.Bytes())
	if got := hex.EncodeToString(sum[:]); got != want {
		t.Errorf("sha256 of the ranks as r50k_base.tiktoken = %s, want %s", got, want)
	}
}

// TestGPT2RoundTrip: tiktoken's round-trip cases (test_basic_roundtrip,
// test_catastrophically_repetitive, test_encode_bytes' runs of 0x80) and
// bytes that are not UTF-8 decode to what was encoded.
func TestGPT2RoundTrip(t *testing.T) {
	cases := []string{"hello", "hello ", "hello  ", " hello", " hello ", " hello  ", "hello world", "请考试我的软件！12345",
		"\xff", "a\xffb\x80c", "\xe4\xbd", "é\xc3", EOTMarker}
	for _, c := range []string{"^", "0", "a", "'s", " ", "\n"} {
		big := strings.Repeat(c, 10_000)
		cases = append(cases, big, " "+big, " "+big+"\n")
	}
	for i := range 10 {
		cases = append(cases, strings.Repeat("\x80", i))
	}
	for _, c := range cases {
		if got := GPT2().Decode(gpt2Encode(c)); got != c {
			t.Errorf("decode(encode(%.40q)) = %.40q", c, got)
		}
	}
	// Text that looks like the special token is ordinary text
	// (encode_ordinary), as nanoGPT's prepare.py encodes documents.
	if got := gpt2Encode(EOTMarker); slices.Contains(got, GPT2EOT) {
		t.Errorf("encode(%q) = %v holds EOT", EOTMarker, got)
	}
}

// FuzzGPT2RoundTrip: any byte string round-trips through the BPE, and every
// id is below the vocabulary.
func FuzzGPT2RoundTrip(f *testing.F) {
	for _, s := range []string{"", "hello world", "a\xffb", "  \n\n x", "请考试", "\xf0\x9f\x91", "it's 2024!!", "\x7f", "\n\n😀\x7f"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		toks := GPT2().AppendEncode(nil, b)
		for _, id := range toks {
			if int(id) >= GPT2EOT {
				t.Fatalf("encode(%q) has id %d", b, id)
			}
		}
		if got := GPT2().Decode(toks); got != string(b) {
			t.Fatalf("decode(encode(%q)) = %q", b, got)
		}
	})
}

// randomText is n characters drawn from ASCII words, spaces, newlines,
// tabs, punctuation, digits and some non-ASCII letters and symbols: the
// places where the pre-tokenizer's pieces begin and end.
func randomText(rng *rand.Rand, n int) string {
	atoms := []string{"the", "cat", "It", "'s", "'ll", " ", " ", "  ", "\n", "\n\n", "\t", " \n", "!", "?!", ".", ",", "0", "42", "é", "ß", "中文", "😀", "--", "x"}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(atoms[rng.IntN(len(atoms))])
	}
	return b.String()
}

// TestStreamEncoderMatchesWhole: a document fed in chunks of any sizes
// encodes exactly as the whole of it does, so data prepare's reading a
// file a MiB at a time does not change its tokens.
func TestStreamEncoderMatchesWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cuts := 0
	for range 200 {
		text := randomText(rng, 1+rng.IntN(400))
		want := gpt2Encode(text)
		s := &streamEncoder{tok: GPT2()}
		var got []uint16
		for rest := text; len(rest) > 0; {
			k := min(len(rest), 1+rng.IntN(40))
			got = append(got, s.write([]byte(rest[:k]))...)
			rest = rest[k:]
		}
		if len(got) > 0 {
			cuts++
		}
		got = append(got, s.flush()...)
		if !slices.Equal(got, want) {
			t.Fatalf("text %q in chunks = %v, whole = %v", text, got, want)
		}
	}
	if cuts < 100 {
		t.Errorf("only %d of 200 documents were cut before their end: the test did not exercise safeCut", cuts)
	}
}

// TestGPT2Merges: merges.txt has GPT-2's header, its first 24 merges (as
// Hugging Face tokenizers' tests quote them) and its last ones, 50,000 in
// all; vocab.json maps a token's Ġ-spelling to its id.
func TestGPT2Merges(t *testing.T) {
	var b bytes.Buffer
	if err := WriteGPT2Merges(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	head := []string{"#version: 0.2", "Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "Ġt he", "e r", "Ġ s", "a t", "Ġ w", "Ġ o",
		"e n", "Ġ c", "i t", "i s", "a n", "o r", "e s", "Ġ b", "e d", "Ġ f", "in g"}
	tail := []string{"Com par", "Ġampl ification", "om inated", "Ġreg ress", "ĠColl ider", "Ġinform ants", "Ġg azed"}
	if len(lines) != 50001 || !slices.Equal(lines[:len(head)], head) || !slices.Equal(lines[len(lines)-len(tail):], tail) {
		t.Fatalf("merges.txt: %d lines, starting %q, ending %q; want 50001, %q and %q",
			len(lines), lines[:min(len(lines), len(head))], lines[max(0, len(lines)-len(tail)):], head, tail)
	}
	b.Reset()
	if err := WriteGPT2Vocab(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"!": 0, `, `"Ġthe": 262, `, `"Ġgazed": 50255, "<|endoftext|>": 50256}`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("vocab.json lacks %s", want)
		}
	}
}

// refPieces is GPT-2's pre-tokenizer written out by hand, a second
// implementation to check the codec's compiled expression against:
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// tried in that order at each position.
func refPieces(s string) []string {
	rs := []rune(s)
	run := func(i int, in func(rune) bool) int {
		for i < len(rs) && in(rs[i]) {
			i++
		}
		return i
	}
	classes := []func(rune) bool{unicode.IsLetter, unicode.IsNumber, isOther}
	var out []string
	for i := 0; i < len(rs); {
		end := -1
		for _, c := range []string{"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"} {
			if strings.HasPrefix(string(rs[i:]), c) {
				end = i + len(c)
				break
			}
		}
		for _, in := range classes {
			if end >= 0 {
				break
			}
			j := i
			if rs[j] == ' ' && j+1 < len(rs) && in(rs[j+1]) {
				j++
			}
			if k := run(j, in); k > j {
				end = k
			}
		}
		if end < 0 { // whitespace: \s+(?!\S) backs off one before a non-space, else \s+
			end = run(i, unicode.IsSpace)
			if end < len(rs) && end-i >= 2 {
				end--
			}
		}
		out = append(out, string(rs[i:end]))
		i = end
	}
	return out
}

// refBPE merges the lowest-ranked adjacent pair, the leftmost on a tie,
// until none is a token: tiktoken's byte_pair_encode.
func refBPE(ranks map[string]uint16, piece string) []uint16 {
	parts := make([]string, len(piece))
	for i := range len(piece) {
		parts[i] = piece[i : i+1]
	}
	for {
		best, bestRank := -1, math.MaxInt
		for i := range len(parts) - 1 {
			if r, ok := ranks[parts[i]+parts[i+1]]; ok && int(r) < bestRank {
				best, bestRank = i, int(r)
			}
		}
		if best < 0 {
			break
		}
		parts[best] += parts[best+1]
		parts = slices.Delete(parts, best+1, best+2)
	}
	ids := make([]uint16, len(parts))
	for i, p := range parts {
		ids[i] = ranks[p]
	}
	return ids
}

// TestGPT2MatchesReference: on random valid UTF-8 text, DELs included,
// the tokenizer gives the ids of the hand-written pre-tokenizer and BPE.
// The codec alone drops every DEL (U+007F).
func TestGPT2MatchesReference(t *testing.T) {
	g := gpt2Once()
	rng := rand.New(rand.NewPCG(3, 4))
	dels := 0
	for n := range 300 {
		text := randomText(rng, 1+rng.IntN(200))
		if n%3 == 0 {
			k := rng.IntN(len(text) + 1)
			text = text[:k] + []string{"\x7f", " \x7f", "!\x7f?", "\x7f\x7f", "'\x7f"}[n%5] + text[k:]
			if !utf8.ValidString(text) {
				continue
			}
			dels++
		}
		var want []uint16
		for _, p := range refPieces(text) {
			want = append(want, refBPE(g.ranks, p)...)
		}
		if got := gpt2Encode(text); !slices.Equal(got, want) {
			t.Fatalf("encode(%q) = %v, the reference %v", text, got, want)
		}
	}
	if dels < 50 {
		t.Fatalf("only %d texts with a DEL", dels)
	}
	for id, p := range g.pieces {
		if len(p) > 1 && bytes.IndexByte(p, del) >= 0 {
			t.Errorf("token %d (%q) holds a DEL: appendValid's split at DELs is wrong", id, p)
		}
	}
}
