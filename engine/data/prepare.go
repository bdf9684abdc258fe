package data

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
)

// PrepareConfig is what Prepare tokenizes and where it writes: the inputs
// of `gtrain data prepare`, whose flags its errors name.
type PrepareConfig struct {
	Inputs      []string // text files, or directories of .txt files
	Out         string   // the directory to write to (created if missing)
	ValFraction float64  // of the documents (of the tokens, for one document) that go to val.bin
	Synthetic   int64    // tokens of synthetic corpus instead of Inputs, when > 0
	Seed        uint64   // of the synthetic corpus
	Tokenizer   string   // "bytes" (the default for "") or "gpt2"
}

// tokenizer is c.Tokenizer, "bytes" when empty.
func (c PrepareConfig) tokenizer() string {
	if c.Tokenizer == "" {
		return TokenizerBytes
	}
	return c.Tokenizer
}

// PreparedFile is one file Prepare wrote.
type PreparedFile struct {
	Path   string `json:"path"`
	Tokens int64  `json:"tokens,omitempty"` // none for meta.json
	Bytes  int64  `json:"bytes"`
}

// PrepareReport is what Prepare wrote: train.bin, val.bin and meta.json,
// in that order, and the meta.json written.
type PrepareReport struct {
	Dir   string         `json:"dir"`
	Files []PreparedFile `json:"files"`
	Meta  Meta           `json:"meta"`
}

// maxSynthetic bounds PrepareConfig.Synthetic: 2^40 tokens are 2 TiB of
// token files, more than any disk a demo runs on (checkDiskSpace then says
// how much is free).
const maxSynthetic = 1 << 40

// maxDocuments bounds the files Prepare tokenizes in one go: meta.json
// lists each of them.
const maxDocuments = 1 << 20

// Prepare tokenizes cfg.Inputs (or cfg.Synthetic tokens of the synthetic
// corpus) with the byte-level or GPT-2's tokenizer into cfg.Out's train.bin and
// val.bin, each replaced atomically, then writes meta.json last: a
// directory whose meta.json is there is complete. Empty input files are
// skipped, and warn (if not nil) hears of each.
//
// Bad configuration and inputs that are missing or empty are usage errors;
// when ctx ends, Prepare returns context.Cause(ctx) and leaves no token file
// behind.
func Prepare(ctx context.Context, cfg PrepareConfig, warn func(msg string)) (*PrepareReport, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	var docs []document
	if cfg.Synthetic == 0 {
		var err error
		if docs, err = findDocuments(ctx, cfg.Inputs, warn); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, fmt.Errorf("data prepare: --out %s: %w; choose a writable directory", cfg.Out, err)
	}
	if cfg.Synthetic > 0 {
		if err := checkDiskSpace(cfg.Out, 2*cfg.Synthetic); err != nil {
			return nil, err
		}
	}
	// An old meta.json would vouch for the new token files while they are
	// being written; without one the directory is visibly incomplete.
	if err := StartDir(cfg.Out); err != nil {
		return nil, err
	}
	rep, err := cfg.writeTokens(ctx, docs)
	if err != nil {
		return nil, err
	}
	metaPath := filepath.Join(cfg.Out, MetaFile)
	if err := WriteMeta(metaPath, rep.Meta); err != nil {
		return nil, err
	}
	fi, err := os.Stat(metaPath)
	if err != nil {
		return nil, fmt.Errorf("data prepare: %w", err)
	}
	rep.Files = append(rep.Files, PreparedFile{Path: metaPath, Bytes: fi.Size()})
	return rep, nil
}

// check validates the configuration before anything is read or written.
func (c PrepareConfig) check() error {
	switch {
	case !(c.ValFraction > 0 && c.ValFraction < 1):
		return usage.Errorf("data prepare: --val-fraction %v: want a fraction between 0 and 1, e.g. 0.1", c.ValFraction)
	case c.Synthetic < 0 || c.Synthetic == 1:
		return usage.Errorf("data prepare: --synthetic %d: want at least 2 tokens (one for train.bin, one for val.bin)", c.Synthetic)
	case c.Synthetic > maxSynthetic:
		return usage.Errorf("data prepare: --synthetic %d: at most %d tokens (%s of token files)", c.Synthetic, int64(maxSynthetic), userfile.Size(2*maxSynthetic))
	case c.Synthetic > 0 && len(c.Inputs) > 0:
		return usage.Errorf("data prepare: --synthetic writes a generated corpus: give it or files (%s), not both", strings.Join(c.Inputs, ", "))
	case c.tokenizer() != TokenizerBytes && c.tokenizer() != TokenizerGPT2:
		return usage.Errorf("data prepare: --tokenizer %q: want bytes or gpt2", c.Tokenizer)
	case c.Synthetic > 0 && c.tokenizer() != TokenizerBytes:
		return usage.Errorf("data prepare: --synthetic writes the byte-level corpus: give text files to tokenize with --tokenizer %s", c.Tokenizer)
	case c.Synthetic == 0 && len(c.Inputs) == 0:
		return usage.Errorf("data prepare: no input: give text files or directories of .txt files, or --synthetic N")
	}
	return nil
}

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
// given, directories as their .txt files. Empty files are left out, and
// warn (if not nil) hears of each.
func findDocuments(ctx context.Context, inputs []string, warn func(string)) ([]document, error) {
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
				if warn != nil {
					warn(fmt.Sprintf("data prepare: skipping %s: empty", d.path))
				}
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
func (c PrepareConfig) writeTokens(ctx context.Context, docs []document) (*PrepareReport, error) {
	train, err := CreateTokens(filepath.Join(c.Out, TrainFile))
	if err != nil {
		return nil, err
	}
	defer train.Abort()
	val, err := CreateTokens(filepath.Join(c.Out, ValFile))
	if err != nil {
		return nil, err
	}
	defer val.Abort()
	tok, err := NewTokenizer(c.tokenizer())
	if err != nil {
		return nil, err
	}
	sw := newSplitWriter(train, val, tok)
	meta := Meta{Tokenizer: tok.Name(), VocabSize: tok.VocabSize(), EOT: tok.EOT()}
	if c.Synthetic > 0 {
		meta.Sources = []string{fmt.Sprintf("synthetic:seed=%d,tokens=%d", c.Seed, c.Synthetic)}
		sw.at = c.Synthetic - valCount(c.ValFraction, c.Synthetic)
		err = SyntheticStream(c.Seed, c.Synthetic, func(toks []uint16) error {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return sw.tokens(toks)
		})
	} else {
		for _, d := range docs {
			meta.Sources = append(meta.Sources, d.path)
		}
		err = sw.documents(ctx, docs, c.ValFraction)
	}
	if err != nil {
		return nil, err
	}
	if train.Len() == 0 || val.Len() == 0 {
		return nil, fmt.Errorf("data prepare: the input changed while it was read (%d tokens for train.bin, %d for val.bin): run again", train.Len(), val.Len())
	}
	rep := &PrepareReport{Dir: c.Out}
	for _, w := range []struct {
		tw   *TokenWriter
		name string
	}{{train, TrainFile}, {val, ValFile}} {
		if err := w.tw.Commit(); err != nil {
			return nil, err
		}
		n := w.tw.Len()
		rep.Files = append(rep.Files, PreparedFile{Path: filepath.Join(c.Out, w.name), Tokens: n, Bytes: 2 * n})
	}
	meta.TrainTokens, meta.ValTokens = train.Len(), val.Len()
	rep.Meta = meta
	return rep, nil
}
