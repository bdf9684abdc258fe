package comm

// Faults of an in-process rank, for this package's tests only: the other
// packages that use InProc need none, so they are not part of its API.

// Stall makes every later Send and Recv on the transport's links block
// until its context ends or the link closes: the rank is stuck.
func (t *InProc) Stall() { t.stalled.Store(true) }

// CloseAfterSends lets n more Sends through, then closes the transport as
// the next Send starts: the rank dies in the middle of an operation.
func (t *InProc) CloseAfterSends(n int) { t.budget.Store(int64(n)) }
