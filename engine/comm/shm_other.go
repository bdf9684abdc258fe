//go:build !linux

package comm

import (
	"context"
	"fmt"
	"runtime"
)

// NewSHM reports that shared-memory links need Linux; Connect falls back
// to TCP only when told to (BootstrapConfig.NoSHM).
func NewSHM(ctx context.Context, cfg SHMConfig) (Transport, error) {
	return nil, fmt.Errorf("comm: shm: not supported on %s (set NoSHM to use TCP)", runtime.GOOS)
}

// shmConn exists on Linux only; elsewhere no link is one.
type shmConn struct{ Conn }

func shmLinks([]Conn) []*shmConn { return nil }

func (o *opState) progressAllReduce([]*shmConn, Buffer, Op) error {
	panic("comm: streaming without shared-memory links")
}

func (o *opState) progressReduceScatter([]*shmConn, blocks, Buffer, Buffer, Op) error {
	panic("comm: streaming without shared-memory links")
}

func (o *opState) progressAllGather([]*shmConn, blocks, Buffer, Buffer) error {
	panic("comm: streaming without shared-memory links")
}
