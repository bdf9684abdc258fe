package data

import (
	"math"
	"math/rand/v2"
	"strconv"
)

// Synthetic returns ntokens tokens of a generated, text-like corpus in the
// byte-level vocabulary, the same for the same seed: documents (each after
// an EOT) of a title line and 3 to 8 numbered lines of simple sentences such
// as
//
//	the cat and the river
//	1. the cat chases a small bird near the house.
//	2. every river hears an old ship!
//	3. there are 4 kings under the tree.
//
// The sentences come from a fixed grammar over 34 words: each subject noun
// has three likely verbs, each verb three likely objects (probabilities 0.6,
// 0.3, 0.1), the subjects favour the two nouns of the title, and "a" becomes
// "an" before a vowel. So there is structure at every range a small model
// can learn: spelling within words, word order, which word follows which,
// line numbers that count, and nouns copied from the title.
//
// Measured over 5M tokens: the generator's entropy is 0.28 nats per token
// (the mean of -ln p over its choices), the floor of a model's loss on it. A
// unigram model cannot go below 2.94 nats (the empirical entropy of single
// tokens), a bigram model below 1.58 and a trigram model below 0.78 (the
// conditional entropy of a token given the one or two before), against
// ln 257 = 5.55 for a uniform guess: a tiny GPT's loss falls below 2 as soon
// as it has learnt which byte follows which.
//
// The last document is cut at ntokens; ntokens <= 0 gives none.
func Synthetic(seed uint64, ntokens int) []uint16 {
	if ntokens <= 0 {
		return []uint16{}
	}
	g := newGenerator(seed)
	out := make([]uint16, 0, ntokens+512)
	for len(out) < ntokens {
		out = g.document(out)
	}
	return out[:ntokens:ntokens]
}

// SyntheticStream generates the corpus of [Synthetic] (the same tokens for
// the same seed and count) a chunk of documents at a time, so that a corpus
// larger than memory can be written: emit gets each chunk, whose slice it
// must not keep, and an error from emit stops the stream and is returned.
func SyntheticStream(seed uint64, ntokens int64, emit func([]uint16) error) error {
	g := newGenerator(seed)
	buf := make([]uint16, 0, 1<<16)
	for ntokens > 0 {
		buf = buf[:0]
		for len(buf) < cap(buf)-1024 && int64(len(buf)) < ntokens {
			buf = g.document(buf)
		}
		n := min(int64(len(buf)), ntokens)
		if err := emit(buf[:n]); err != nil {
			return err
		}
		ntokens -= n
	}
	return nil
}

// The grammar's words. Every noun takes a plain "s" plural.
var (
	synNouns = []string{"cat", "dog", "bird", "horse", "king", "queen", "ship", "tree", "river", "stone"}
	synAdjs  = []string{"small", "red", "old", "quiet", "happy", "bright"}
	synPreps = []string{"near", "under", "with", "behind", "over"}
	synDets  = []string{"the", "a", "every"}
	synEnds  = []string{".", "!", "?"}

	detWeights    = []float64{0.6, 0.3, 0.1}
	endWeights    = []float64{0.8, 0.1, 0.1}
	likelyWeights = []float64{0.6, 0.3, 0.1}

	// subjectVerbs are each noun's likely verbs, most likely first.
	subjectVerbs = map[string][3]string{
		"cat": {"chases", "watches", "likes"}, "dog": {"follows", "chases", "hears"},
		"bird": {"sees", "hears", "loves"}, "horse": {"follows", "finds", "likes"},
		"king": {"loves", "watches", "finds"}, "queen": {"likes", "sees", "follows"},
		"ship": {"finds", "follows", "sees"}, "tree": {"hears", "watches", "loves"},
		"river": {"hears", "finds", "sees"}, "stone": {"watches", "sees", "likes"},
	}
	// verbObjects are each verb's likely objects, most likely first.
	verbObjects = map[string][3]string{
		"chases": {"bird", "cat", "horse"}, "follows": {"river", "king", "ship"},
		"hears": {"bird", "river", "dog"}, "sees": {"ship", "tree", "stone"},
		"loves": {"queen", "tree", "horse"}, "finds": {"stone", "king", "cat"},
		"likes": {"dog", "queen", "river"}, "watches": {"king", "bird", "ship"},
	}
)

// generator writes documents of the grammar and keeps the sum of -ln p of
// its choices (nats), from which the tests measure its entropy. Every choice
// shows in the text, so that sum is the information the text carries.
type generator struct {
	rng    *rand.Rand
	nats   float64
	title  [2]int
	weight []float64 // the subject distribution of the current document
}

func newGenerator(seed uint64) *generator {
	pcg := rand.NewPCG(mix64(seed^seedSalt), mix64(seed^drawSalt^0x3c6ef372fe94f82b))
	return &generator{rng: rand.New(pcg), weight: make([]float64, len(synNouns))}
}

// document appends one document: EOT, a title, numbered lines.
func (g *generator) document(out []uint16) []uint16 {
	a := g.uniform(len(synNouns))
	b := (a + 1 + g.uniform(len(synNouns)-1)) % len(synNouns)
	g.title = [2]int{a, b}
	for i := range g.weight {
		g.weight[i] = 0.03 // a subject not in the title
	}
	g.weight[a] += 0.35
	g.weight[b] += 0.35
	out = append(out, EOT)
	out = appendText(out, "the ", synNouns[a], " and the ", synNouns[b], "\n")
	lines := 3 + g.uniform(6)
	for i := 1; i <= lines; i++ {
		out = appendText(out, strconv.Itoa(i), ". ")
		out = g.sentence(out)
		out = appendText(out, "\n")
	}
	return out
}

// sentence appends one sentence: subject, verb, object, or "there are".
func (g *generator) sentence(out []uint16) []uint16 {
	if g.pick([]float64{0.85, 0.15}) == 1 {
		n := strconv.Itoa(2 + g.uniform(8))
		out = appendText(out, "there are ", n, " ", synNouns[g.uniform(len(synNouns))], "s")
	} else {
		subj := synNouns[g.pick(g.weight)]
		verb := subjectVerbs[subj][g.pick(likelyWeights)]
		obj := verbObjects[verb][g.pick(likelyWeights)]
		out = g.nounPhrase(out, subj)
		out = appendText(out, " ", verb, " ")
		out = g.nounPhrase(out, obj)
	}
	if g.pick([]float64{0.7, 0.3}) == 1 {
		out = appendText(out, " ", synPreps[g.uniform(len(synPreps))], " the ", synNouns[g.uniform(len(synNouns))])
	}
	return appendText(out, synEnds[g.pick(endWeights)])
}

// nounPhrase appends a determiner, maybe an adjective, and noun.
func (g *generator) nounPhrase(out []uint16, noun string) []uint16 {
	det := synDets[g.pick(detWeights)]
	adj := ""
	if g.pick([]float64{0.7, 0.3}) == 1 {
		adj = synAdjs[g.uniform(len(synAdjs))]
	}
	if first := adj + noun; det == "a" && isVowel(first[0]) {
		det = "an"
	}
	if adj != "" {
		return appendText(out, det, " ", adj, " ", noun)
	}
	return appendText(out, det, " ", noun)
}

func isVowel(c byte) bool {
	return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'
}

// pick returns i with probability w[i] (w sums to 1) and counts its
// information.
func (g *generator) pick(w []float64) int {
	r := g.rng.Float64()
	for i, p := range w {
		if r < p || i == len(w)-1 {
			g.nats -= math.Log(p)
			return i
		}
		r -= p
	}
	return 0 // not reached: w is never empty
}

// uniform returns one of [0, n) and counts its information.
func (g *generator) uniform(n int) int {
	g.nats += math.Log(float64(n))
	return g.rng.IntN(n)
}

// appendText appends the byte tokens of the strings.
func appendText(out []uint16, parts ...string) []uint16 {
	for _, s := range parts {
		for i := 0; i < len(s); i++ {
			out = append(out, uint16(s[i]))
		}
	}
	return out
}
