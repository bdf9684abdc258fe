package kernels

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// The Sgemm benchmarks report GFLOP/s (2·m·n·k per call) on the model's
// shapes; docs/bench/gemm.sh runs them against OpenBLAS on the same shapes,
// which it passes in GTRAIN_SGEMM_SHAPES (space-separated names as below).
//
// A shape is named <op(A)><op(B)>_<m>x<n>x<k>[_ld<lda>,<ldb>,<ldc>], op N
// or T; without _ld the strides are the logical widths. The defaults are
// GPT-2 124M (C = 768) with N = 1024 tokens (256 for the logits, 50257
// wide), its attention with head size 64 at T = 1024 and 256 (Q, K and V
// read out of the (T, 3C) buffer), and a small model (C = 256, V = 257).
var gemmBenchShapes = []string{
	"NN_1024x2304x768",                 // qkv = x·Wqkv
	"NN_1024x768x768",                  // attention projection
	"NN_1024x3072x768",                 // fc
	"NN_1024x768x3072",                 // fc projection
	"NT_256x50257x768",                 // logits = x·Wteᵀ
	"NT_1024x768x3072",                 // backward: dx = dy·Wᵀ of fc
	"NT_1024x3072x768",                 // backward: dx of fc projection
	"TN_768x3072x1024",                 // backward: dW = xᵀ·dy of fc
	"TN_3072x768x1024",                 // backward: dW of fc projection
	"NT_1024x1024x64_ld2304,2304,1024", // attention scores q·kᵀ, T = 1024
	"NN_1024x64x1024_ld1024,2304,768",  // attention out = att·v, T = 1024
	"NT_256x256x64_ld2304,2304,256",    // scores, T = 256
	"NN_256x64x256_ld256,2304,768",     // att·v, T = 256
	"NN_1024x768x256",                  // small model: qkv
	"NN_1024x256x1024",                 // small model: fc projection
	"NT_1024x257x256",                  // small model: logits
	"NN_2048x1152x384",                 // small preset (C = 384, 8×256 tokens): qkv
	"NN_2048x1536x384",                 // small preset: fc
	"NN_2048x384x1536",                 // small preset: fc projection
	"NT_2048x1536x384",                 // small preset: backward dx of fc projection
	"TN_384x1536x2048",                 // small preset: backward dW of fc
}

// gemmBenchShape is a parsed shape name.
type gemmBenchShape struct {
	name                   string
	transA, transB         bool
	m, n, k, ld0, ld1, ld2 int
}

func parseGemmShape(s string) (gemmBenchShape, error) {
	sh := gemmBenchShape{name: s}
	var ops string
	rest, strides, hasLD := strings.Cut(s, "_ld")
	if _, err := fmt.Sscanf(rest, "%2s_%dx%dx%d", &ops, &sh.m, &sh.n, &sh.k); err != nil || len(ops) != 2 {
		return sh, fmt.Errorf("shape %q: want <N|T><N|T>_<m>x<n>x<k>[_ld<lda>,<ldb>,<ldc>]", s)
	}
	sh.transA, sh.transB = ops[0] == 'T', ops[1] == 'T'
	if strings.Trim(ops, "NT") != "" || sh.m < 1 || sh.n < 1 || sh.k < 1 {
		return sh, fmt.Errorf("shape %q: bad operation or dimension", s)
	}
	sh.ld0, sh.ld1, sh.ld2 = sh.k, sh.n, sh.n
	if sh.transA {
		sh.ld0 = sh.m
	}
	if sh.transB {
		sh.ld1 = sh.k
	}
	if hasLD {
		if _, err := fmt.Sscanf(strides, "%d,%d,%d", &sh.ld0, &sh.ld1, &sh.ld2); err != nil {
			return sh, fmt.Errorf("shape %q: bad strides: %w", s, err)
		}
	}
	return sh, nil
}

// operands allocates the shape's matrices, filled with small numbers.
func (sh gemmBenchShape) operands() (a, b, c []float32) {
	ar, br := sh.m, sh.k
	if sh.transA {
		ar = sh.k
	}
	if sh.transB {
		br = sh.n
	}
	a, b, c = make([]float32, ar*sh.ld0), make([]float32, br*sh.ld1), make([]float32, sh.m*sh.ld2)
	for i := range a {
		a[i] = float32(i%17)/16 - 0.5
	}
	for i := range b {
		b[i] = float32(i%13)/12 - 0.5
	}
	return a, b, c
}

func gemmBenchShapeList(b testing.TB) []gemmBenchShape {
	names := gemmBenchShapes
	if env := os.Getenv("GTRAIN_SGEMM_SHAPES"); env != "" {
		names = strings.Fields(env)
	}
	var shapes []gemmBenchShape
	for _, name := range names {
		sh, err := parseGemmShape(name)
		if err != nil {
			b.Fatal(err)
		}
		shapes = append(shapes, sh)
	}
	return shapes
}

// benchSgemm times sgemmAt(lv, threads, ...) with alpha 1 and beta 0.
func benchSgemm(b *testing.B, lv *gemmLevel, sh gemmBenchShape, threads int) {
	x, y, z := sh.operands()
	b.ReportAllocs()
	for b.Loop() {
		sgemmAt(lv, threads, sh.transA, sh.transB, sh.m, sh.n, sh.k, 1, x, sh.ld0, y, sh.ld1, 0, z, sh.ld2)
	}
	flops := 2 * float64(sh.m) * float64(sh.n) * float64(sh.k) * float64(b.N)
	b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkSgemm runs Sgemm (the best level) on every shape with 1 and 2
// threads: Sgemm/<shape>/t<threads>.
func BenchmarkSgemm(b *testing.B) {
	for _, sh := range gemmBenchShapeList(b) {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/t%d", sh.name, threads), func(b *testing.B) {
				benchSgemm(b, &gemmLevels[cpuLevel], sh, threads)
			})
		}
	}
}

// benchSgemmBF16 times sgemmBF16At(lv, threads, ...) with alpha 1 and
// beta 0, reporting GFLOP/s as benchSgemm does.
func benchSgemmBF16(b *testing.B, lv *gemmLevel, sh gemmBenchShape, threads int) {
	x, y, z := sh.operands()
	b.ReportAllocs()
	for b.Loop() {
		sgemmBF16At(lv, threads, sh.transA, sh.transB, sh.m, sh.n, sh.k, 1, x, sh.ld0, y, sh.ld1, 0, z, sh.ld2)
	}
	flops := 2 * float64(sh.m) * float64(sh.n) * float64(sh.k) * float64(b.N)
	b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// benchSgemmBF16B times sgemmBF16BAt(lv, threads, ...), B in bfloat16,
// with alpha 1 and beta 0, reporting GFLOP/s as benchSgemm does.
func benchSgemmBF16B(b *testing.B, lv *gemmLevel, sh gemmBenchShape, threads int) {
	x, y, z := sh.operands()
	h := make([]uint16, len(y))
	for i, v := range y {
		h[i] = bf16Bits(v)
	}
	b.ReportAllocs()
	for b.Loop() {
		sgemmBF16BAt(lv, threads, sh.transA, sh.transB, sh.m, sh.n, sh.k, 1, x, sh.ld0, h, sh.ld1, 0, z, sh.ld2)
	}
	flops := 2 * float64(sh.m) * float64(sh.n) * float64(sh.k) * float64(b.N)
	b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkGemmPrecision runs Sgemm, SgemmBF16 and SgemmBF16B (B already
// bfloat16, as the weights are), each at the best level this machine has,
// side by side on every shape with 1 and 2 threads:
// GemmPrecision/<shape>/<fp32|bf16|bf16w>/t<threads>.
func BenchmarkGemmPrecision(b *testing.B) {
	bf16 := gemmBF16Level
	if bf16 == nil {
		bf16 = &gemmLevels[cpuLevel]
	}
	for _, sh := range gemmBenchShapeList(b) {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/fp32/t%d", sh.name, threads), func(b *testing.B) {
				benchSgemm(b, &gemmLevels[cpuLevel], sh, threads)
			})
			b.Run(fmt.Sprintf("%s/bf16/t%d", sh.name, threads), func(b *testing.B) {
				benchSgemmBF16(b, bf16, sh, threads)
			})
			b.Run(fmt.Sprintf("%s/bf16w/t%d", sh.name, threads), func(b *testing.B) {
				benchSgemmBF16B(b, bf16, sh, threads)
			})
		}
	}
}

// BenchmarkSgemmLevel runs every level this machine has on every shape,
// one thread: SgemmLevel/<shape>/<level>. The AVX2 kernel is the one CPUs
// without AVX-512 use.
func BenchmarkSgemmLevel(b *testing.B) {
	for _, sh := range gemmBenchShapeList(b) {
		for l := levelGo; l <= cpuLevel; l++ {
			b.Run(fmt.Sprintf("%s/%v", sh.name, l), func(b *testing.B) {
				benchSgemm(b, &gemmLevels[l], sh, 1)
			})
		}
	}
}
