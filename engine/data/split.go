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
type splitWriter struct {
	train, val *TokenWriter
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
		if err := s.tokens([]uint16{EOT}); err != nil {
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
