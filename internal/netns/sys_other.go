//go:build !linux

package netns

import (
	"errors"
	"os"
	"syscall"
)

const supported = false

func hostSysProcAttr() *syscall.SysProcAttr { return nil }

func lockFile(*os.File) error { return errors.New("netns: not supported on this OS") }

func kill(int, syscall.Signal) error { return errors.New("netns: not supported on this OS") }
