package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/generate"
)

// GenerateOptions are the inputs of `gtrain generate`.
type GenerateOptions struct {
	IO  *IOStreams
	Req generate.Request
	// Output is text (each sample after its prompt, as sample.py prints
	// them) or json.
	Output string
}

// NewCmdGenerate wires the flags of `gtrain generate` into
// GenerateOptions; generateRun does the work.
func NewCmdGenerate(ios *IOStreams) *cobra.Command {
	o := &GenerateOptions{IO: ios, Req: generate.Request{Op: "generate"}}
	cmd := &cobra.Command{
		Use:   "generate RUN_OR_STEP_DIR [flags]",
		Short: "Sample text from a checkpoint on this machine",
		Long: `Sample text from a checkpoint of the built-in engine, as nanoGPT's sample.py
does, on this machine's CPUs. RUN_OR_STEP_DIR is a run's checkpoint directory
(its newest valid checkpoint is taken) or one step directory; a checkpoint of
any layout (data, tensor or pipeline parallel, any ZeRO stage) is verified and
assembled into the full model.

Each sample continues --prompt by --tokens tokens, drawn one at a time from
the softmax of the logits divided by --temperature, cut to the --top-k most
likely (0: no cut); --temperature 0 takes the most likely token. A KV cache
keeps the time per token flat: generation is linear in its length. The
prompt is encoded with the run's tokenizer (the meta.json of its data; the
byte-level one for the synthetic corpus), "<|endoftext|>" standing for the
end-of-text token; an empty prompt starts a document. A prompt longer than
the model's context is cropped from the left, as sample.py crops to
block_size, and a warning says so; when a sample fills the context, its
older half is dropped. The same --seed gives the same samples.

Prints each sample after its prompt, samples separated by a line of dashes;
-o json prints one document with the prompt's tokens and each sample's text
and tokens.`,
		Example: `  gtrain generate runs/20260101-120000 --prompt "the cat" --tokens 200
  gtrain generate runs/gpt2/step-00001000 --temperature 0 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Req.From = args[0]
			return generateRun(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Req.Prompt, "prompt", "", `text to continue ("<|endoftext|>" is the end-of-text token; empty: start a document)`)
	f.IntVar(&o.Req.Tokens, "tokens", 256, "tokens to generate per sample")
	f.Float64Var(&o.Req.Temperature, "temperature", 0.8, "divide the logits by this; 0 takes the most likely token")
	f.IntVar(&o.Req.TopK, "top-k", 200, "draw from the k most likely tokens only; 0 for all")
	f.Uint64Var(&o.Req.Seed, "seed", 1337, "seed of the draws")
	f.IntVar(&o.Req.NumSamples, "num-samples", 1, "samples to generate")
	f.StringVar(&o.Req.Tokenizer, "tokenizer", "", "bytes or gpt2 (default: the run's, from its data's meta.json)")
	f.IntVar(&o.Req.Threads, "threads", 0, "compute goroutines (default: this machine's CPUs)")
	addOutputFlag(f, &o.Output, "one document: the prompt's tokens, each sample's text and tokens")
	return cmd
}

// generateRun samples and prints.
func generateRun(ctx context.Context, o *GenerateOptions) error {
	o.Req.Warn = func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", msg) }
	res, err := generate.Run(ctx, o.Req)
	if err != nil {
		return err
	}
	if o.Output == outputJSON {
		return writeJSON(o.IO.Out, res)
	}
	return printSamples(o.IO.Out, res)
}

// printSamples writes each sample after its prompt and a line of dashes,
// as sample.py does. Bytes that are not UTF-8 (a BPE sample cut inside a
// character) become U+FFFD, as tiktoken's decode replaces them.
func printSamples(w io.Writer, res *generate.Result) error {
	var b strings.Builder
	for _, s := range res.Samples {
		b.WriteString(strings.ToValidUTF8(res.Prompt+s.Text, "\uFFFD"))
		b.WriteString("\n---------------\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
