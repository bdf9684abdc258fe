package data

import (
	"errors"
	"math"
	"slices"
	"testing"
)

func TestSyntheticDeterministic(t *testing.T) {
	a, b, c := Synthetic(1, 20000), Synthetic(1, 20000), Synthetic(2, 20000)
	if !slices.Equal(a, b) {
		t.Fatal("Synthetic(1) differs between calls")
	}
	if slices.Equal(a, c) {
		t.Fatal("seeds 1 and 2 give the same corpus")
	}
	if short := Synthetic(1, 777); !slices.Equal(short, a[:777]) {
		t.Error("a shorter corpus is not a prefix of the longer one")
	}
}

func TestSyntheticShape(t *testing.T) {
	for _, n := range []int{-1, 0, 1, 100, 50000} {
		toks := Synthetic(9, n)
		if len(toks) != max(n, 0) {
			t.Fatalf("Synthetic(%d) has %d tokens", n, len(toks))
		}
		if n <= 0 {
			continue
		}
		if toks[0] != EOT {
			t.Errorf("Synthetic(%d) starts with %d, want EOT", n, toks[0])
		}
		for i, tok := range toks {
			if tok != EOT && tok != '\n' && (tok < ' ' || tok > '~') {
				t.Fatalf("token %d at %d: want printable ASCII, newline or EOT", tok, i)
			}
		}
	}
}

// TestSyntheticEntropy is the guarantee of learnable structure: the
// generator's own entropy is far below what a unigram model can reach, and
// knowing the previous byte alone already helps a lot.
func TestSyntheticEntropy(t *testing.T) {
	g := newGenerator(5)
	var toks []uint16
	for len(toks) < 1_000_000 {
		toks = g.document(toks)
	}
	truth := g.nats / float64(len(toks))
	uni, bi := ngramEntropies(toks)
	t.Logf("nats/token: generator %.3f, unigram %.3f, bigram %.3f (uniform %.3f)", truth, uni, bi, math.Log(ByteVocabSize))
	switch {
	case truth > 0.5:
		t.Errorf("generator entropy %.3f nats/token, want below 0.5", truth)
	case uni < 2.5:
		t.Errorf("unigram entropy %.3f, want above 2.5: a unigram model would do too well", uni)
	case bi > 2 || bi > uni-1:
		t.Errorf("bigram conditional entropy %.3f, want below 2 and 1 nat below the unigram's %.3f", bi, uni)
	}
}

// ngramEntropies are the empirical entropy of a token and the conditional
// entropy of a token given the one before, in nats.
func ngramEntropies(toks []uint16) (uni, bi float64) {
	var one [ByteVocabSize]float64
	var two [ByteVocabSize][ByteVocabSize]float64
	for i, t := range toks {
		one[t]++
		if i > 0 {
			two[toks[i-1]][t]++
		}
	}
	n := float64(len(toks))
	for a, c := range one {
		if c > 0 {
			uni -= c / n * math.Log(c/n)
		}
		for _, cb := range two[a] {
			if cb > 0 {
				bi -= cb / (n - 1) * math.Log(cb/c)
			}
		}
	}
	return uni, bi
}

// TestSyntheticStream: the stream is Synthetic's corpus, chunk by chunk.
func TestSyntheticStream(t *testing.T) {
	for _, n := range []int{0, 1, 1000, 200_000} {
		var got []uint16
		chunks := 0
		err := SyntheticStream(7, int64(n), func(c []uint16) error {
			got = append(got, c...)
			chunks++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := Synthetic(7, n); !slices.Equal(got, want) {
			t.Errorf("SyntheticStream(7, %d): %d tokens differ from Synthetic's %d", n, len(got), len(want))
		}
		if n == 200_000 && chunks < 2 {
			t.Errorf("SyntheticStream(7, %d) came in %d chunk(s), want several", n, chunks)
		}
	}
	stop := errors.New("stop")
	if err := SyntheticStream(7, 1<<40, func([]uint16) error { return stop }); err != stop {
		t.Errorf("SyntheticStream with a failing emit = %v, want its error", err)
	}
}
