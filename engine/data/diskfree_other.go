//go:build !unix

package data

// diskFree cannot tell free space here: the write fails when the disk is
// full instead.
func diskFree(string) (int64, bool) { return 0, false }
