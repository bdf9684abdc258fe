//go:build !(linux && cgo)

package detect

import (
	"context"
	"errors"
)

// localGPUs of a build without cgo (or not for Linux) finds none: go-nvml
// loads libnvidia-ml.so.1 through cgo.
func localGPUs(context.Context, fsys) gpuFacts {
	return gpuFacts{err: errors.New("detect: GPUs: this gtrain was built without cgo (or not for Linux) and cannot load NVML: build it with CGO_ENABLED=1 on Linux to see GPUs")}
}
