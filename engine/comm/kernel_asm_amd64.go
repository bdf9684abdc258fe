//go:build amd64 && !purego

package comm

// Assembly kernels. Each takes n, a multiple of its level's block, and
// pointers to at least n elements; dst may equal a or b, not overlap them
// partly.

//go:noescape
func sumF32AVX2(dst, a, b *float32, n int)

//go:noescape
func maxF32AVX2(dst, a, b *float32, n int)

//go:noescape
func minF32AVX2(dst, a, b *float32, n int)

//go:noescape
func divF32AVX2(dst *float32, n int, d float32)

//go:noescape
func sumBF16AVX2(dst, a, b *uint16, n int)

//go:noescape
func maxBF16AVX2(dst, a, b *uint16, n int)

//go:noescape
func minBF16AVX2(dst, a, b *uint16, n int)

//go:noescape
func divBF16AVX2(dst *uint16, n int, d float32)

//go:noescape
func sumF16AVX2(dst, a, b *uint16, n int)

//go:noescape
func maxF16AVX2(dst, a, b *uint16, n int)

//go:noescape
func minF16AVX2(dst, a, b *uint16, n int)

//go:noescape
func divF16AVX2(dst *uint16, n int, d float32)

//go:noescape
func encodeBF16AVX2(dst *uint16, src *float32, n int)

//go:noescape
func decodeBF16AVX2(dst *float32, src *uint16, n int)

//go:noescape
func encodeF16AVX2(dst *uint16, src *float32, n int)

//go:noescape
func decodeF16AVX2(dst *float32, src *uint16, n int)

//go:noescape
func sumF32AVX512(dst, a, b *float32, n int)

//go:noescape
func maxF32AVX512(dst, a, b *float32, n int)

//go:noescape
func minF32AVX512(dst, a, b *float32, n int)

//go:noescape
func divF32AVX512(dst *float32, n int, d float32)

//go:noescape
func sumBF16AVX512(dst, a, b *uint16, n int)

//go:noescape
func maxBF16AVX512(dst, a, b *uint16, n int)

//go:noescape
func minBF16AVX512(dst, a, b *uint16, n int)

//go:noescape
func divBF16AVX512(dst *uint16, n int, d float32)

//go:noescape
func sumF16AVX512(dst, a, b *uint16, n int)

//go:noescape
func maxF16AVX512(dst, a, b *uint16, n int)

//go:noescape
func minF16AVX512(dst, a, b *uint16, n int)

//go:noescape
func divF16AVX512(dst *uint16, n int, d float32)

//go:noescape
func encodeBF16AVX512(dst *uint16, src *float32, n int)

//go:noescape
func decodeBF16AVX512(dst *float32, src *uint16, n int)

//go:noescape
func encodeF16AVX512(dst *uint16, src *float32, n int)

//go:noescape
func decodeF16AVX512(dst *float32, src *uint16, n int)
