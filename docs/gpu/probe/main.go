// gpuprobe: can a static Go binary (CGO_ENABLED=0) drive a GPU through the
// driver API, cuBLAS and NCCL loaded at run time with purego? A feasibility
// probe for issue 21, run on the lent machine; not part of gtrain.
package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
)

func open(path string) uintptr {
	t := time.Now()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		fmt.Printf("dlopen %s: %v\n", path, err)
		os.Exit(1)
	}
	fmt.Printf("dlopen %s: ok in %v\n", path, time.Since(t))
	return h
}

func reg(fptr any, lib uintptr, name string) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Printf("symbol %s: %v\n", name, r)
			os.Exit(1)
		}
	}()
	purego.RegisterLibFunc(fptr, lib, name)
}

func check(what string, rc int32) {
	if rc != 0 {
		fmt.Printf("%s: error %d\n", what, rc)
		os.Exit(1)
	}
}

func main() {
	if len(os.Args) != 4 {
		fmt.Println("usage: gpuprobe PTX LIBCUBLAS LIBNCCL")
		os.Exit(2)
	}
	ptx, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	ptx = append(ptx, 0)
	cu := open("libcuda.so.1")
	var (
		cuInit                   func(uint32) int32
		cuDriverGetVersion       func(*int32) int32
		cuDeviceGetCount         func(*int32) int32
		cuDeviceGet              func(*int32, int32) int32
		cuDeviceGetName          func(*byte, int32, int32) int32
		cuDevicePrimaryCtxRetain func(*uintptr, int32) int32
		cuCtxSetCurrent          func(uintptr) int32
		cuModuleLoadData         func(*uintptr, unsafe.Pointer) int32
		cuModuleGetFunction      func(*uintptr, uintptr, *byte) int32
		cuMemAlloc               func(*uint64, uint64) int32
		cuMemcpyHtoD             func(uint64, unsafe.Pointer, uint64) int32
		cuMemcpyDtoH             func(unsafe.Pointer, uint64, uint64) int32
		cuLaunchKernel           func(uintptr, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uintptr, unsafe.Pointer, unsafe.Pointer) int32
		cuCtxSynchronize         func() int32
		cuMemGetInfo             func(*uint64, *uint64) int32
	)
	reg(&cuInit, cu, "cuInit")
	reg(&cuDriverGetVersion, cu, "cuDriverGetVersion")
	reg(&cuDeviceGetCount, cu, "cuDeviceGetCount")
	reg(&cuDeviceGet, cu, "cuDeviceGet")
	reg(&cuDeviceGetName, cu, "cuDeviceGetName")
	reg(&cuDevicePrimaryCtxRetain, cu, "cuDevicePrimaryCtxRetain")
	reg(&cuCtxSetCurrent, cu, "cuCtxSetCurrent")
	reg(&cuModuleLoadData, cu, "cuModuleLoadData")
	reg(&cuModuleGetFunction, cu, "cuModuleGetFunction")
	reg(&cuMemAlloc, cu, "cuMemAlloc_v2")
	reg(&cuMemcpyHtoD, cu, "cuMemcpyHtoD_v2")
	reg(&cuMemcpyDtoH, cu, "cuMemcpyDtoH_v2")
	reg(&cuLaunchKernel, cu, "cuLaunchKernel")
	reg(&cuCtxSynchronize, cu, "cuCtxSynchronize")
	reg(&cuMemGetInfo, cu, "cuMemGetInfo_v2")

	runtime.LockOSThread() // a CUDA context is current per thread
	t := time.Now()
	check("cuInit", cuInit(0))
	fmt.Printf("cuInit: %v\n", time.Since(t))
	var ver, count, dev int32
	check("cuDriverGetVersion", cuDriverGetVersion(&ver))
	check("cuDeviceGetCount", cuDeviceGetCount(&count))
	check("cuDeviceGet", cuDeviceGet(&dev, 0))
	name := make([]byte, 128)
	check("cuDeviceGetName", cuDeviceGetName(&name[0], 128, dev))
	fmt.Printf("driver API %d, %d device(s), device 0: %s\n", ver, count, cstr(name))
	var ctx uintptr
	t = time.Now()
	check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, dev))
	check("cuCtxSetCurrent", cuCtxSetCurrent(ctx))
	fmt.Printf("primary context: %v\n", time.Since(t))
	var free, total uint64
	check("cuMemGetInfo", cuMemGetInfo(&free, &total))
	fmt.Printf("memory: %.1f GiB free of %.1f GiB\n", float64(free)/(1<<30), float64(total)/(1<<30))

	var mod, fn uintptr
	t = time.Now()
	check("cuModuleLoadData", cuModuleLoadData(&mod, unsafe.Pointer(&ptx[0])))
	fmt.Printf("cuModuleLoadData (PTX JIT): %v\n", time.Since(t))
	kname := append([]byte("vecadd"), 0)
	check("cuModuleGetFunction", cuModuleGetFunction(&fn, mod, &kname[0]))

	const n = 1 << 20
	a, b, c := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range a {
		a[i], b[i] = float32(i), float32(2*i)
	}
	var da, db, dc uint64
	for _, p := range []*uint64{&da, &db, &dc} {
		check("cuMemAlloc", cuMemAlloc(p, 4*n))
	}
	check("HtoD", cuMemcpyHtoD(da, unsafe.Pointer(&a[0]), 4*n))
	check("HtoD", cuMemcpyHtoD(db, unsafe.Pointer(&b[0]), 4*n))
	nn := int32(n)
	params := []unsafe.Pointer{unsafe.Pointer(&da), unsafe.Pointer(&db), unsafe.Pointer(&dc), unsafe.Pointer(&nn)}
	var pin runtime.Pinner
	for _, p := range params {
		pin.Pin(p)
	}
	pin.Pin(&params[0])
	t = time.Now()
	check("cuLaunchKernel", cuLaunchKernel(fn, n/256, 1, 1, 256, 1, 1, 0, 0, unsafe.Pointer(&params[0]), nil))
	check("cuCtxSynchronize", cuCtxSynchronize())
	fmt.Printf("vecadd launch+sync: %v\n", time.Since(t))
	pin.Unpin()
	check("DtoH", cuMemcpyDtoH(unsafe.Pointer(&c[0]), dc, 4*n))
	bad := 0
	for i := range c {
		if c[i] != float32(3*i) {
			bad++
		}
	}
	fmt.Printf("vecadd: %d wrong of %d\n", bad, n)

	// cuBLAS: C = A·B, 64×64 float32, against the CPU.
	cb := open(os.Args[2])
	var (
		cublasCreate     func(*uintptr) int32
		cublasGetVersion func(uintptr, *int32) int32
		cublasSgemm      func(uintptr, int32, int32, int32, int32, int32, *float32, uint64, int32, uint64, int32, *float32, uint64, int32) int32
	)
	reg(&cublasCreate, cb, "cublasCreate_v2")
	reg(&cublasGetVersion, cb, "cublasGetVersion_v2")
	reg(&cublasSgemm, cb, "cublasSgemm_v2")
	var h uintptr
	check("cublasCreate", cublasCreate(&h))
	var cbv int32
	check("cublasGetVersion", cublasGetVersion(h, &cbv))
	const m = 64
	A, B, C := make([]float32, m*m), make([]float32, m*m), make([]float32, m*m)
	for i := range A {
		A[i], B[i] = float32(i%7)-3, float32(i%5)-2
	}
	check("HtoD", cuMemcpyHtoD(da, unsafe.Pointer(&A[0]), 4*m*m))
	check("HtoD", cuMemcpyHtoD(db, unsafe.Pointer(&B[0]), 4*m*m))
	one, zero := float32(1), float32(0)
	check("cublasSgemm", cublasSgemm(h, 0, 0, m, m, m, &one, da, m, db, m, &zero, dc, m))
	check("cuCtxSynchronize", cuCtxSynchronize())
	check("DtoH", cuMemcpyDtoH(unsafe.Pointer(&C[0]), dc, 4*m*m))
	maxErr := 0.0
	for i := range m { // column-major: C[i + j*m] = sum_k A[i + k*m] B[k + j*m]
		for j := range m {
			s := float32(0)
			for k := range m {
				s += A[i+k*m] * B[k+j*m]
			}
			maxErr = math.Max(maxErr, math.Abs(float64(s-C[i+j*m])))
		}
	}
	fmt.Printf("cuBLAS %d: Sgemm 64x64 max |error| vs CPU %g\n", cbv, maxErr)

	// NCCL: version, one-rank all-reduce, and whether two ranks may share
	// one GPU (ncclCommInitAll with device 0 twice).
	nc := open(os.Args[3])
	var (
		ncclGetVersion     func(*int32) int32
		ncclCommInitAll    func(*uintptr, int32, *int32) int32
		ncclAllReduce      func(uint64, uint64, uint64, int32, int32, uintptr, uintptr) int32
		ncclGetErrorString func(int32) string
	)
	reg(&ncclGetVersion, nc, "ncclGetVersion")
	reg(&ncclCommInitAll, nc, "ncclCommInitAll")
	reg(&ncclAllReduce, nc, "ncclAllReduce")
	reg(&ncclGetErrorString, nc, "ncclGetErrorString")
	var nv int32
	check("ncclGetVersion", ncclGetVersion(&nv))
	fmt.Printf("NCCL %d\n", nv)
	devs := []int32{0, 0}
	comms := make([]uintptr, 2)
	if rc := ncclCommInitAll(&comms[0], 1, &devs[0]); rc != 0 {
		fmt.Printf("ncclCommInitAll 1 rank: %d %s\n", rc, ncclGetErrorString(rc))
	} else {
		check("ncclAllReduce", ncclAllReduce(da, dc, 16, 7 /* ncclFloat32 */, 0 /* sum */, comms[0], 0))
		check("cuCtxSynchronize", cuCtxSynchronize())
		fmt.Println("ncclAllReduce on 1 rank: ok")
	}
	if rc := ncclCommInitAll(&comms[0], 2, &devs[0]); rc != 0 {
		fmt.Printf("ncclCommInitAll 2 ranks on device 0: refused: %d %s\n", rc, ncclGetErrorString(rc))
	} else {
		fmt.Println("ncclCommInitAll 2 ranks on device 0: allowed")
	}
}

func cstr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
