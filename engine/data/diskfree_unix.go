//go:build unix

package data

import "golang.org/x/sys/unix"

// diskFree is the bytes an unprivileged user may still write to the file
// system that holds dir; ok is false when that cannot be told.
func diskFree(dir string) (free int64, ok bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}
