//go:build !amd64 || purego

package kernels

// Without the assembly kernels (another architecture, or the purego build
// tag) the Go code does all the work.
const cpuLevel = levelGo
