//go:build linux && cgo

package detect

import (
	"context"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlLib is the part of go-nvml's nvml.Interface detection uses: the real
// library (nvml.New) and go-nvml's mock (pkg/nvml/mock) both satisfy it.
type nvmlLib interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	SystemGetDriverVersion() (string, nvml.Return)
	SystemGetCudaDriverVersion() (int, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// nvmlMu serialises scans: go-nvml keeps the loaded library's versioned
// entry points in package variables, which every Init rewrites, so two
// scans at once (hosts check of two names for this machine) would race.
var nvmlMu sync.Mutex

// localGPUs scans this machine's GPUs through libnvidia-ml.so.1. When the
// library is absent go-nvml's Init fails (dlopen's error is turned into
// ERROR_LIBRARY_NOT_FOUND, no panic) and no other NVML call is made: any
// call after a failed Init would jump to an unresolved symbol and kill
// the process.
func localGPUs(ctx context.Context, f fsys) gpuFacts {
	nvmlMu.Lock()
	defer nvmlMu.Unlock()
	lib := nvml.New()
	has := func(sym string) bool { return lib.Extensions().LookupSymbol(sym) == nil }
	return scanNVML(ctx, f, lib, has)
}

// scanNVML initialises lib, reads every GPU and the matrix, and shuts lib
// down. has reports whether the loaded library has a symbol: NVML calls
// newer than the driver's library must not be made.
func scanNVML(ctx context.Context, f fsys, lib nvmlLib, has func(string) bool) gpuFacts {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return gpuFacts{err: initError(ret)}
	}
	defer lib.Shutdown()
	var g gpuFacts
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		g.driver = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS && v > 0 {
		g.cuda = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		g.err = fmt.Errorf("detect: GPUs: nvml DeviceGetCount: %v: check nvidia-smi", ret)
		return g
	}
	n = min(n, maxGPUs)
	var devs []nvml.Device
	for i := 0; i < n && ctx.Err() == nil; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			g.problems = append(g.problems, fmt.Sprintf("GPU %d: NVML cannot open it (%v): it may be lost or in a bad state; see nvidia-smi -i %d and dmesg for Xid errors", i, ret, i))
			continue
		}
		gpu, bad := readGPU(f, d, i, has)
		g.problems = append(g.problems, bad...)
		g.gpus = append(g.gpus, gpu)
		devs = append(devs, d)
	}
	markSwitchLinks(g.gpus, has)
	g.matrix = matrix(g.gpus, devs)
	return g
}

// maxGPUs bounds the devices read: NVML reports at most 64 today.
const maxGPUs = 256

// initError says why NVML did not start, and what to do.
func initError(ret nvml.Return) error {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("detect: GPUs: no NVIDIA driver: libnvidia-ml.so.1 cannot be loaded (%v); install the driver to use GPUs", ret)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("detect: GPUs: the NVIDIA kernel module is not loaded (%v): check nvidia-smi and dmesg", ret)
	case nvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("detect: GPUs: no permission to open the NVIDIA devices (%v): check /dev/nvidia*", ret)
	}
	return fmt.Errorf("detect: GPUs: nvml Init: %v: check nvidia-smi", ret)
}
