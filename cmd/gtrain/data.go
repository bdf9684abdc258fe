package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/data"
)

// NewCmdData is `gtrain data`, the parent of the data commands.
func NewCmdData(ios *IOStreams) *cobra.Command {
	return newGroup("data", "Prepare training data for the built-in engine", "", NewCmdDataPrepare(ios))
}

// DataPrepareOptions are the inputs of `gtrain data prepare`.
type DataPrepareOptions struct {
	IO          *IOStreams
	Inputs      []string // text files, or directories of .txt files
	Out         string   // the directory to write to
	ValFraction float64
	Synthetic   int    // tokens of synthetic corpus instead of Inputs, when > 0
	Seed        uint64 // of the synthetic corpus
	Tokenizer   string // bytes or gpt2
	Output      string // text or json
}

// NewCmdDataPrepare wires the flags of `gtrain data prepare` into
// DataPrepareOptions; dataPrepareRun does the work.
func NewCmdDataPrepare(ios *IOStreams) *cobra.Command {
	o := &DataPrepareOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "prepare [flags] FILE...",
		Short: "Tokenize text files into train.bin, val.bin and meta.json",
		Long: `Tokenize text files with the built-in byte-level tokenizer (vocabulary 257:
the 256 byte values, and EOT = 256 before each document) or, with
--tokenizer gpt2, GPT-2's byte-level BPE (tiktoken's gpt2 encoding, as
nanoGPT's prepare.py uses it: vocabulary 50257, EOT = <|endoftext|> = 50256
before each document; the ranks are built in, nothing is downloaded), and
write them in nanoGPT's .bin layout (little-endian uint16 token ids, no
header) to --out/train.bin and --out/val.bin, then --out/meta.json, which
describes them and names the tokenizer. A job on GPT-2 tokens needs
model.vocab of at least 50257 (the gpt2 presets; nanoGPT pads to 50304).

Each file is one document; a directory stands for the .txt files under it, in
lexical order. The last --val-fraction of the documents (at least one) go to
val.bin; a single document is split at a token instead (gpt2: at a byte, each
part encoded apart, as prepare.py does), its end going to val.bin. Empty files are skipped. With --synthetic N, N tokens of the built-in
synthetic corpus are written instead (a demo needs no download).

Files are replaced atomically, and meta.json is written last: a directory
whose meta.json is there is complete. Exits 2 when an input is missing or
empty, 1 when the output cannot be written.`,
		Example: `  gtrain data prepare shakespeare.txt
  gtrain data prepare --out data/books --val-fraction 0.05 books/
  gtrain data prepare --tokenizer gpt2 --out data/shakespeare input.txt
  gtrain data prepare --synthetic 1000000 --out data/synthetic -o json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Inputs = args
			return dataPrepareRun(cmd.Context(), o)
		},
	}
	cmd.Flags().SetNormalizeFunc(underscoreToDash)
	f := cmd.Flags()
	f.StringVar(&o.Out, "out", "data", "directory to write train.bin, val.bin and meta.json to (created if missing)")
	f.Float64Var(&o.ValFraction, "val-fraction", 0.1, "fraction of the documents (of the tokens, for one document) that go to val.bin")
	f.IntVar(&o.Synthetic, "synthetic", 0, "write this many tokens of the built-in synthetic corpus instead of reading files")
	f.Uint64Var(&o.Seed, "seed", 1337, "seed of the --synthetic corpus")
	f.StringVar(&o.Tokenizer, "tokenizer", data.TokenizerBytes, "bytes (byte-level, vocabulary 257) or gpt2 (GPT-2's BPE, vocabulary 50257)")
	addOutputFlag(f, &o.Output, "one document naming the files written")
	return cmd
}

// dataPrepareRun writes the token files and meta.json, and reports them.
func dataPrepareRun(ctx context.Context, o *DataPrepareOptions) error {
	cfg := data.PrepareConfig{Inputs: o.Inputs, Out: o.Out, ValFraction: o.ValFraction, Synthetic: int64(o.Synthetic), Seed: o.Seed, Tokenizer: o.Tokenizer}
	rep, err := data.Prepare(ctx, cfg, func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: %s\n", msg) })
	if err != nil {
		return err
	}
	return printPrepared(o.IO.Out, o.Output, rep)
}

// printPrepared writes the report: a line per file, or one JSON document.
func printPrepared(w io.Writer, output string, rep *data.PrepareReport) error {
	if output == "json" {
		return writeJSON(w, rep)
	}
	var b strings.Builder
	for _, f := range rep.Files {
		if f.Tokens > 0 {
			fmt.Fprintf(&b, "wrote %s: %d tokens (%d bytes)\n", f.Path, f.Tokens, f.Bytes)
		}
	}
	m := rep.Meta
	fmt.Fprintf(&b, "wrote %s: tokenizer %s, vocab %d, eot %d, %d source(s)\n",
		filepath.Join(rep.Dir, data.MetaFile), m.Tokenizer, m.VocabSize, m.EOT, len(m.Sources))
	_, err := io.WriteString(w, b.String())
	return err
}
