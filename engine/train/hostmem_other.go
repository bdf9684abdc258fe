//go:build !linux

package train

// hostMemory is unknown outside Linux: no job is refused for memory there.
func hostMemory() (capacity, now, process memLimit) { return }
