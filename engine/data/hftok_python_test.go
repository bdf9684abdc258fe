package data

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/internal/proctest"
)

// pythonGPT2BPE is GPT-2's own tokenizer algorithm (OpenAI's encoder.py,
// which Hugging Face's GPT2Tokenizer follows) over the vocab.json and
// merges.txt in argv[1]: the pre-tokenizer regex on Python's `regex`
// module, bytes mapped to unicode, and merges applied by their line in
// merges.txt. It reads a JSON list of texts on stdin and prints their ids.
const pythonGPT2BPE = `
import json, sys, regex
d = sys.argv[1]
vocab = json.load(open(d + "/vocab.json", encoding="utf-8"))
lines = open(d + "/merges.txt", encoding="utf-8").read().split("\n")
assert lines[0] == "#version: 0.2" and lines[-1] == "", (lines[0], lines[-1])
ranks = {tuple(l.split(" ")): i for i, l in enumerate(lines[1:-1])}
printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
byte_char, extra = {}, 0
for b in range(256):
    if b in printable:
        byte_char[b] = chr(b)
    else:
        byte_char[b] = chr(256 + extra); extra += 1
pat = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
def bpe(word):
    parts = list(word)
    while len(parts) > 1:
        pairs = [(ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        r, _ = min(pairs)
        if r == 1 << 30:
            break
        first, second = lines[1 + r].split(" ")
        out, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and parts[i] == first and parts[i + 1] == second:
                out.append(first + second); i += 2
            else:
                out.append(parts[i]); i += 1
        parts = out
    return parts
res = []
for text in json.load(sys.stdin):
    ids = []
    for piece in pat.findall(text):
        ids += [vocab[p] for p in bpe("".join(byte_char[b] for b in piece.encode("utf-8")))]
    res.append(ids)
print(json.dumps(res))
`

// pythonWithRegex is a python3 that has the regex module, which GPT-2's
// pre-tokenizer needs (\p{L} classes), or why there is none.
func pythonWithRegex() (string, error) {
	var why []string
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		path, err := exec.LookPath(c)
		if err == nil {
			err = exec.Command(path, "-c", "import regex").Run()
		}
		if err == nil {
			return path, nil
		}
		why = append(why, fmt.Sprintf("%s: %v", c, err))
	}
	return "", fmt.Errorf("no python3 with the regex module (pip install regex): %s", strings.Join(why, "; "))
}

// TestGPT2FilesMatchEncoderPy: GPT-2's original algorithm, run by Python
// on the vocab.json and merges.txt that WriteGPT2TokenizerFiles writes,
// gives the ids this package's tokenizer gives: the files are what
// GPT2Tokenizer needs, and the BPE and pre-tokenizer agree with a third
// implementation.
func TestGPT2FilesMatchEncoderPy(t *testing.T) {
	python, err := pythonWithRegex()
	if err != nil {
		proctest.Missing(t, "GTRAIN_REQUIRE_PYTHON_REGEX", err)
	}
	dir := t.TempDir()
	files, err := WriteGPT2TokenizerFiles(dir, 1024)
	if err != nil || len(files) != 3 {
		t.Fatalf("WriteGPT2TokenizerFiles = %v, %v", files, err)
	}
	texts := []string{"hello world", "Hello, I'm a language model,", "  leading spaces\n\n\ttabs and 12345 numbers!!",
		"请考试我的软件！12345", "It's the cat's toy; they'll've DEL\x7f here", strings.Repeat("0", 17)}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 100 {
		texts = append(texts, randomText(rng, 1+rng.IntN(120)))
	}
	in, _ := json.Marshal(texts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", pythonGPT2BPE, dir)
	cmd.Stdin, cmd.Stderr = strings.NewReader(string(in)), os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	var want [][]int
	if err := json.Unmarshal(out, &want); err != nil || len(want) != len(texts) {
		t.Fatalf("python printed %d results (%v), want %d", len(want), err, len(texts))
	}
	for i, text := range texts {
		got := gpt2Encode(text)
		w := make([]uint16, len(want[i]))
		for j, id := range want[i] {
			w[j] = uint16(id)
		}
		if !slices.Equal(got, w) {
			t.Errorf("encode(%q) = %v, encoder.py on the files %v", text, got, w)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, HFTokenizerConfigFile)); err != nil {
		t.Error(err)
	}
}
