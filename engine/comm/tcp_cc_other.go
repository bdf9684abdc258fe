//go:build !linux

package comm

import "errors"

func setTCPCongestion(fd int, name string) error {
	return errors.New("setting a socket's congestion control is Linux-only")
}
