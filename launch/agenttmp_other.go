//go:build !linux

package launch

import "os"

// lockTmp takes no liveness lock off Linux: the directory of an agent that
// is killed stays, as it did before agents locked theirs.
func lockTmp(string) (*os.File, error) { return nil, nil }

// sweepTmp removes nothing off Linux.
func sweepTmp(string, string) []string { return nil }
