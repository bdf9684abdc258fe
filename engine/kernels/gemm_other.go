//go:build !amd64 || purego

package kernels

// gemmLevels are the kernels of each level; only the Go ones here.
var gemmLevels = [...]gemmLevel{levelGo: gemmGoLevel}
