package etcdtest

import "syscall"

// sysProcAttr kills etcd with the test binary, even one killed outright.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
