package ckpt

import (
	"context"
	"fmt"
	"io"
)

// Verifying and exporting read every byte of a checkpoint, gigabytes for
// the larger models: they check their context before every chunk (a MiB),
// so that the first Ctrl-C stops them at once rather than after minutes.

// testHookChunk, when set by a test, is called after every chunk that
// verifying or exporting reads.
var testHookChunk func()

// stopped is nil while ctx goes on; once it has ended, the error of op on
// target, wrapping ctx's cause (a caller finds the signal that ended it with
// errors.As).
func stopped(ctx context.Context, op, target string) error {
	if ctx.Err() == nil {
		return nil
	}
	return fmt.Errorf("ckpt: %s %s: %w", op, target, context.Cause(ctx))
}

// ctxReader is r that fails with ctx's cause once ctx has ended, checked
// before every read: a copy through it stops within one buffer of ctx's end.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if c.ctx.Err() != nil {
		return 0, context.Cause(c.ctx)
	}
	n, err := c.r.Read(p)
	if testHookChunk != nil {
		testHookChunk()
	}
	return n, err
}
