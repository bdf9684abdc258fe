//go:build linux && cgo

package detect

import (
	"context"
	"testing"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// DGXFixture is the DGX H100-like host of testdata/dgx-h100.txtar as
// detection sees it (GPUs from the mock NVML), for tests outside the
// package.
func DGXFixture(t *testing.T) hostinfo.Host {
	return detect(context.Background(), fixture(t, "dgx-h100.txtar"), dgxH100().scan())
}
