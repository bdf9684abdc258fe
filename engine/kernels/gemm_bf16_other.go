//go:build !amd64 || purego

package kernels

// Without the assembly kernels SgemmBF16 rounds its operands into copies
// and multiplies them with Sgemm's kernels.
var gemmBF16Level *gemmLevel
