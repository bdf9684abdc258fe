package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/data"
	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
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
the 256 byte values, and EOT = 256 before each document) and write them in
nanoGPT's .bin layout (little-endian uint16 token ids, no header) to
--out/train.bin and --out/val.bin, then --out/meta.json, which describes them.

Each file is one document; a directory stands for the .txt files under it, in
lexical order. The last --val-fraction of the documents (at least one) go to
val.bin; a single document is split at a token instead, its end going to
val.bin. Empty files are skipped. With --synthetic N, N tokens of the built-in
synthetic corpus are written instead (a demo needs no download).

Files are replaced atomically, and meta.json is written last: a directory
whose meta.json is there is complete. Exits 2 when an input is missing or
empty, 1 when the output cannot be written.`,
		Example: `  gtrain data prepare shakespeare.txt
  gtrain data prepare --out data/books --val-fraction 0.05 books/
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
	addOutputFlag(f, &o.Output, "one document naming the files written")
	return cmd
}

// preparedFile is one file written, as reported.
type preparedFile struct {
	Path   string `json:"path"`
	Tokens int64  `json:"tokens,omitempty"`
	Bytes  int64  `json:"bytes"`
}

// prepareReport is what --output json prints.
type prepareReport struct {
	Dir   string         `json:"dir"`
	Files []preparedFile `json:"files"`
	Meta  data.Meta      `json:"meta"`
}

// dataPrepareRun writes the token files and meta.json, and reports them.
func dataPrepareRun(ctx context.Context, o *DataPrepareOptions) error {
	if err := o.check(); err != nil {
		return err
	}
	var docs []document
	if o.Synthetic == 0 {
		var err error
		if docs, err = findDocuments(ctx, o.Inputs, o.IO.Err); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return fmt.Errorf("data prepare: --out %s: %w; choose a writable directory", o.Out, err)
	}
	if o.Synthetic > 0 {
		if err := checkDiskSpace(o.Out, 2*int64(o.Synthetic)); err != nil {
			return err
		}
	}
	// An old meta.json would vouch for the new token files while they are
	// being written; without one the directory is visibly incomplete.
	if err := data.StartDir(o.Out); err != nil {
		return err
	}
	metaPath := filepath.Join(o.Out, data.MetaFile)
	rep, err := o.writeTokens(ctx, docs)
	if err != nil {
		return err
	}
	if err := data.WriteMeta(metaPath, rep.Meta); err != nil {
		return err
	}
	fi, err := os.Stat(metaPath)
	if err != nil {
		return fmt.Errorf("data prepare: %w", err)
	}
	rep.Files = append(rep.Files, preparedFile{Path: metaPath, Bytes: fi.Size()})
	return printPrepared(o.IO.Out, o.Output, rep)
}

// check validates the flags and arguments.
func (o *DataPrepareOptions) check() error {
	switch {
	case !(o.ValFraction > 0 && o.ValFraction < 1):
		return usage.Errorf("data prepare: --val-fraction %v: want a fraction between 0 and 1, e.g. 0.1", o.ValFraction)
	case o.Synthetic < 0 || o.Synthetic == 1:
		return usage.Errorf("data prepare: --synthetic %d: want at least 2 tokens (one for train.bin, one for val.bin)", o.Synthetic)
	case o.Synthetic > maxSynthetic:
		return usage.Errorf("data prepare: --synthetic %d: at most %d tokens (%s of token files)", o.Synthetic, int64(maxSynthetic), userfile.Size(2*maxSynthetic))
	case o.Synthetic > 0 && len(o.Inputs) > 0:
		return usage.Errorf("data prepare: --synthetic writes a generated corpus: give it or files (%s), not both", strings.Join(o.Inputs, ", "))
	case o.Synthetic == 0 && len(o.Inputs) == 0:
		return usage.Errorf("data prepare: no input: give text files or directories of .txt files, or --synthetic N")
	}
	return nil
}

// maxSynthetic bounds --synthetic: 2^40 tokens are 2 TiB of token files,
// more than any disk a demo runs on (checkDiskSpace then says how much is
// free).
const maxSynthetic = 1 << 40

// maxDocuments bounds the files data prepare tokenizes in one go: meta.json
// lists each of them.
const maxDocuments = 1 << 20

// checkDiskSpace refuses to write more bytes into dir than its file system
// has free, before filling it up.
func checkDiskSpace(dir string, need int64) error {
	free, ok := diskFree(dir)
	if ok && need > free {
		return usage.Errorf("data prepare: the tokens need %s (2 bytes a token) and %s has %s free: ask for fewer, or choose another --out",
			userfile.Size(need), dir, userfile.Size(free))
	}
	return nil
}

// document is one input file.
type document struct {
	path string
	size int64
}

// findDocuments expands the inputs into the documents to tokenize: files as
// given, directories as their .txt files. Empty files are left out, with a
// warning on warn.
func findDocuments(ctx context.Context, inputs []string, warn io.Writer) ([]document, error) {
	var docs []document
	for _, in := range inputs {
		found, err := expandInput(ctx, in)
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if err == nil && len(docs)+len(found) > maxDocuments {
			err = fmt.Errorf("more than %d files to tokenize: prepare them in parts", maxDocuments)
		}
		if err != nil {
			return nil, usage.Errorf("data prepare: %w", err)
		}
		for _, d := range found {
			if d.size == 0 {
				fmt.Fprintf(warn, "gtrain: data prepare: skipping %s: empty\n", d.path)
				continue
			}
			docs = append(docs, d)
		}
	}
	if len(docs) == 0 {
		return nil, usage.Errorf("data prepare: no text in %s: give files with text, or --synthetic N", strings.Join(inputs, ", "))
	}
	return docs, nil
}

// expandInput is the documents of one input: a regular file, or the .txt
// files under a directory (at most maxDocuments of them; the walk stops when
// ctx is done).
func expandInput(ctx context.Context, in string) ([]document, error) {
	fi, err := os.Stat(in)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = fmt.Errorf("%s: %w", in, pe.Err) // "stat" is no news to the user
		}
		return nil, err
	}
	if fi.Mode().IsRegular() {
		return []document{{path: in, size: fi.Size()}}, nil
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s: not a regular file or directory", in)
	}
	var docs []document
	err = filepath.WalkDir(in, func(path string, d fs.DirEntry, err error) error {
		switch {
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case len(docs) > maxDocuments:
			return fmt.Errorf("%s: more than %d .txt files: prepare them in parts", in, maxDocuments)
		case err != nil || !d.Type().IsRegular() || !strings.EqualFold(filepath.Ext(path), ".txt"):
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		docs = append(docs, document{path: path, size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("%s: no .txt files in this directory", in)
	}
	return docs, nil
}

// writeTokens writes train.bin and val.bin, each atomically, and returns
// the report of both (meta.json still to come).
func (o *DataPrepareOptions) writeTokens(ctx context.Context, docs []document) (*prepareReport, error) {
	train, err := data.CreateTokens(filepath.Join(o.Out, data.TrainFile))
	if err != nil {
		return nil, err
	}
	defer train.Abort()
	val, err := data.CreateTokens(filepath.Join(o.Out, data.ValFile))
	if err != nil {
		return nil, err
	}
	defer val.Abort()
	sw := &splitWriter{train: train, val: val, at: math.MaxInt64}
	meta := data.Meta{Tokenizer: data.TokenizerBytes, VocabSize: data.ByteVocabSize, EOT: data.EOT}
	if o.Synthetic > 0 {
		meta.Sources = []string{fmt.Sprintf("synthetic:seed=%d,tokens=%d", o.Seed, o.Synthetic)}
		sw.at = int64(o.Synthetic) - valCount(o.ValFraction, int64(o.Synthetic))
		err = data.SyntheticStream(o.Seed, int64(o.Synthetic), func(toks []uint16) error {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return sw.tokens(toks)
		})
	} else {
		for _, d := range docs {
			meta.Sources = append(meta.Sources, d.path)
		}
		err = sw.documents(ctx, docs, o.ValFraction)
	}
	if err != nil {
		return nil, err
	}
	if train.Len() == 0 || val.Len() == 0 {
		return nil, fmt.Errorf("data prepare: the input changed while it was read (%d tokens for train.bin, %d for val.bin): run again", train.Len(), val.Len())
	}
	rep := &prepareReport{Dir: o.Out}
	for _, w := range []struct {
		tw   *data.TokenWriter
		name string
	}{{train, data.TrainFile}, {val, data.ValFile}} {
		if err := w.tw.Commit(); err != nil {
			return nil, err
		}
		n := w.tw.Len()
		rep.Files = append(rep.Files, preparedFile{Path: filepath.Join(o.Out, w.name), Tokens: n, Bytes: 2 * n})
	}
	meta.TrainTokens, meta.ValTokens = train.Len(), val.Len()
	rep.Meta = meta
	return rep, nil
}

// valCount is how many of n items (documents, or tokens of one document) go
// to validation: the fraction, rounded, but at least one and not all.
func valCount(frac float64, n int64) int64 {
	return min(max(int64(math.Round(frac*float64(n))), 1), n-1)
}

// splitWriter sends tokens to train until token index at, then to val.
type splitWriter struct {
	train, val *data.TokenWriter
	at, n      int64
}

// toTrain is how many of the next k tokens go to train.
func (s *splitWriter) toTrain(k int) int {
	return int(min(int64(k), max(0, s.at-s.n)))
}

func (s *splitWriter) tokens(toks []uint16) error {
	k := s.toTrain(len(toks))
	s.n += int64(len(toks))
	if err := s.train.WriteTokens(toks[:k]); err != nil {
		return err
	}
	return s.val.WriteTokens(toks[k:])
}

func (s *splitWriter) bytes(b []byte) error {
	k := s.toTrain(len(b))
	s.n += int64(len(b))
	if err := s.train.WriteByteTokens(b[:k]); err != nil {
		return err
	}
	return s.val.WriteByteTokens(b[k:])
}

// documents writes each document as EOT and its bytes. Several documents
// are split between documents, the last ones going to val; a single one is
// split at a token.
func (s *splitWriter) documents(ctx context.Context, docs []document, frac float64) error {
	firstVal := len(docs) - int(valCount(frac, int64(len(docs))))
	if len(docs) == 1 {
		n := docs[0].size + 1 // EOT and the bytes
		s.at, firstVal = n-valCount(frac, n), 1
	}
	buf := make([]byte, 1<<20)
	for i, d := range docs {
		if i == firstVal {
			s.at = s.n
		}
		if err := s.tokens([]uint16{data.EOT}); err != nil {
			return err
		}
		if err := s.copyFile(ctx, d.path, buf); err != nil {
			return err
		}
	}
	return nil
}

// copyFile writes the bytes of the file path as tokens, checking ctx between
// chunks so that an interrupt stops a long prepare.
func (s *splitWriter) copyFile(ctx context.Context, path string, buf []byte) error {
	f, err := userfile.Open(ctx, path)
	if err != nil {
		return userfile.Prefix(ctx, "data prepare", err)
	}
	defer f.Close()
	// Only regular files were found; one replaced since by a FIFO or a
	// device would block or never end.
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return usage.Errorf("data prepare: %s: not a regular file (any more)", path)
	}
	for {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		n, err := f.Read(buf)
		if werr := s.bytes(buf[:n]); werr != nil {
			return werr
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("data prepare: read %s: %w", path, err)
		}
	}
}

// printPrepared writes the report: a line per file, or one JSON document.
func printPrepared(w io.Writer, output string, rep *prepareReport) error {
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
