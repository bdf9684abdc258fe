package data

import (
	"context"
	"fmt"
	"io"
	"math"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
)

// valCount is how many of n items (documents, or tokens of one document) go
// to validation: the fraction, rounded, but at least one and not all.
func valCount(frac float64, n int64) int64 {
	return min(max(int64(math.Round(frac*float64(n))), 1), n-1)
}

// splitWriter sends tokens to train until token index at, then to val.
// With a BPE tokenizer (enc not nil) a single document is split at byte
// cutByte instead, its two parts encoded apart, as nanoGPT's prepare.py
// splits a text before encoding it.
type splitWriter struct {
	train, val *TokenWriter
	at, n      int64
	eot        uint16
	enc        *streamEncoder // nil: the byte-level tokenizer, a token a byte
	cutByte    int64          // > 0: where a single document's val part starts
	read       int64          // bytes of the document so far
}

// newSplitWriter writes tok's tokens to train, then val.
func newSplitWriter(train, val *TokenWriter, tok Tokenizer) *splitWriter {
	s := &splitWriter{train: train, val: val, at: math.MaxInt64, eot: uint16(tok.EOT())}
	if tok.Name() != TokenizerBytes {
		s.enc = &streamEncoder{tok: tok}
	}
	return s
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

// documents writes each document as EOT and its tokens. Several documents
// are split between documents, the last ones going to val; a single one is
// split at a token (byte-level) or a byte (BPE).
func (s *splitWriter) documents(ctx context.Context, docs []document, frac float64) error {
	firstVal := len(docs) - int(valCount(frac, int64(len(docs))))
	if len(docs) == 1 {
		n := docs[0].size + 1 // EOT and the bytes
		s.at, firstVal = n-valCount(frac, n), 1
		if s.enc != nil {
			s.at, s.cutByte = math.MaxInt64, docs[0].size-valCount(frac, docs[0].size)
		}
	}
	buf := make([]byte, 1<<20)
	for i, d := range docs {
		if i == firstVal {
			s.at = s.n
		}
		if err := s.tokens([]uint16{s.eot}); err != nil {
			return err
		}
		s.read = 0
		if err := s.copyFile(ctx, d.path, buf); err != nil {
			return err
		}
		if s.enc != nil {
			if err := s.tokens(s.enc.flush()); err != nil {
				return err
			}
		}
	}
	return nil
}

// text writes the next bytes of a document as tokens.
func (s *splitWriter) text(b []byte) error {
	if s.enc == nil {
		return s.bytes(b)
	}
	if s.cutByte > 0 && s.read < s.cutByte && s.read+int64(len(b)) >= s.cutByte {
		k := s.cutByte - s.read
		s.read += k
		if err := s.tokens(s.enc.write(b[:k])); err != nil {
			return err
		}
		if err := s.tokens(s.enc.flush()); err != nil {
			return err
		}
		s.at, b = s.n, b[k:]
	}
	s.read += int64(len(b))
	return s.tokens(s.enc.write(b))
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
		if werr := s.text(buf[:n]); werr != nil {
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
