package data

import (
	"fmt"
	"runtime/debug"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A mapped token file that is truncated under a running job makes reads of
// the lost pages fault: SIGBUS, which kills a Go program with a stack dump.
// One rewritten in place (cp over it) changes the data mid-run, and the
// batches of a resumed run no longer match. Every read of the mapping is
// therefore bracketed:
//
//	if err := t.begin(); err != nil {
//		return err
//	}
//	defer t.end(&err, debug.SetPanicOnFault(true))
//
// begin checks with fstat that the file still has the size and
// modification time it had when mapped; SetPanicOnFault (per goroutine)
// turns a fault during the read into a panic that end recovers into a
// *ChangedError, and end checks the file again, so that a batch read while
// the file changed is not used. fstat costs a microsecond, nothing beside a
// training step, and neither allocates.

// ChangedError is a mapped token file that was truncated or rewritten in
// place while the job read it.
type ChangedError struct {
	File   string
	Detail string // what was seen
}

// Error names the file and says what to do.
func (e *ChangedError) Error() string {
	return fmt.Sprintf("data: read %s: the file changed under the running job (%s): put the original back and resume from the last checkpoint (gtrain resume); to change the data of a job, write a new file and rename it over the old one, as gtrain data prepare does", e.File, e.Detail)
}

// begin checks a mapped file before a read of its mapping.
func (t *Tokens) begin() error {
	if t.mapped == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(t.fd, &st); err != nil {
		return fmt.Errorf("data: read %s: %w", t.name, err)
	}
	switch {
	case st.Size != t.size:
		return &ChangedError{File: t.name, Detail: fmt.Sprintf("%d bytes now, %d when opened: truncated or rewritten in place", st.Size, t.size)}
	case st.Mtim != t.mtime:
		return &ChangedError{File: t.name, Detail: "modified since it was opened: rewritten in place"}
	}
	return nil
}

// end is deferred by a read of the mapping, with the result of
// debug.SetPanicOnFault(true): it restores that setting, turns a fault
// inside the mapping into a *ChangedError in *errp (any other panic goes
// on), and checks the file again.
func (t *Tokens) end(errp *error, panicOnFault bool) {
	debug.SetPanicOnFault(panicOnFault)
	if r := recover(); r != nil {
		off, ok := t.faultOffset(r)
		if !ok {
			panic(r)
		}
		*errp = &ChangedError{File: t.name, Detail: fmt.Sprintf("reading byte %d of %d faulted: truncated while being read", off, t.size)}
		return
	}
	if *errp == nil {
		*errp = t.begin()
	}
}

// faultOffset is the offset in the mapping of the memory fault that r, a
// recovered panic value, reports; false when r is not such a fault.
func (t *Tokens) faultOffset(r any) (uintptr, bool) {
	// With SetPanicOnFault the runtime panics with a runtime.Error that
	// has the faulting address.
	f, ok := r.(interface{ Addr() uintptr })
	if !ok || len(t.mapped) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(&t.mapped[0]))
	addr := f.Addr()
	if addr < base || addr-base >= uintptr(len(t.mapped)) {
		return 0, false
	}
	return addr - base, true
}
