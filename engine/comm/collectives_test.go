package comm

import (
	"fmt"
	"testing"

	"github.com/gtrain/gtrain/engine/comm/commtest"
)

// The correctness matrix: every collective × dtype × group size 1..8 ×
// element count (odd and prime among them) × in-place/out-of-place × op,
// under each algorithm, against a float64 reference. Small chunks make the
// ring pipeline many chunks even for these counts.

var (
	testDTypes = []DType{Float32, BFloat16, Float16}
	testCounts = []int{1, 2, 7, 13, 1000, 4099}
	testOps    = []Op{Sum, Avg, Max, Min}
)

// matrixCase runs one collective on a group with one dtype and count.
type matrixCase struct {
	name     string
	reducing bool // run for every op
	inPlace  bool // run in and out of place
	run      func(t *testing.T, comms []*Communicator, a caseArgs)
}

type caseArgs struct {
	dt      DType
	n       int
	op      Op
	inPlace bool
	salt    int
}

var matrixCases = []matrixCase{
	{"all_reduce", true, false, testAllReduce},
	{"reduce_scatter", true, true, testReduceScatter},
	{"all_gather", false, true, testAllGather},
	{"broadcast", false, false, testBroadcast},
	{"reduce", true, true, testReduce},
	{"gather", false, true, testGather},
	{"scatter", false, true, testScatter},
}

func TestCollectives(t *testing.T) {
	for _, alg := range []string{"ring", "rd", "tree"} {
		for p := 1; p <= 8; p++ {
			t.Run(fmt.Sprintf("%s/p%d", alg, p), func(t *testing.T) {
				t.Parallel()
				comms := newWorld(t, p, Options{Algorithm: alg, ChunkBytes: 1024})
				runMatrix(t, comms)
			})
		}
	}
}

// runMatrix runs every case of the matrix on comms, one after the other.
func runMatrix(t *testing.T, comms []*Communicator) {
	salt := 0
	for _, mc := range matrixCases {
		for _, a := range matrixArgs(mc) {
			salt++
			a.salt = salt
			name := fmt.Sprintf("%s/%v/n%d", mc.name, a.dt, a.n)
			if mc.reducing {
				name += "/" + a.op.String()
			}
			if mc.inPlace && a.inPlace {
				name += "/in_place"
			}
			t.Run(name, func(t *testing.T) { mc.run(t, comms, a) })
		}
	}
}

func matrixArgs(mc matrixCase) []caseArgs {
	ops, places := []Op{0}, []bool{false}
	if mc.reducing {
		ops = testOps
	}
	if mc.inPlace {
		places = []bool{false, true}
	}
	var all []caseArgs
	for _, dt := range testDTypes {
		for _, n := range testCounts {
			for _, op := range ops {
				for _, ip := range places {
					all = append(all, caseArgs{dt: dt, n: n, op: op, inPlace: ip})
				}
			}
		}
	}
	return all
}

func testAllReduce(t *testing.T, comms []*Communicator, a caseArgs) {
	p := len(comms)
	bufs, ins := make([]Buffer, p), make([][]float64, p)
	for r := range p {
		bufs[r], ins[r] = makeInput(a.dt, a.n, a.salt, r)
	}
	commtest.Must(t, p, nil, func(r int) error { return comms[r].AllReduce(t.Context(), bufs[r], a.op) })
	ref, tol := refReduce(a.dt, a.op, ins, 0, a.n)
	for r := range p {
		checkNear(t, fmt.Sprintf("rank %d", r), bufs[r], ref, tol)
		checkBits(t, fmt.Sprintf("rank %d against rank 0", r), bufs[r].Bytes(), bufs[0].Bytes())
	}
}

func testReduceScatter(t *testing.T, comms []*Communicator, a caseArgs) {
	p := len(comms)
	q := partition{a.n, p}
	send, recv, ins := make([]Buffer, p), make([]Buffer, p), make([][]float64, p)
	for r := range p {
		send[r], ins[r] = makeInput(a.dt, a.n, a.salt, r)
		recv[r] = garbage(a.dt, q.count(r))
		if a.inPlace {
			recv[r] = q.block(send[r], r)
		}
	}
	commtest.Must(t, p, nil, func(r int) error { return comms[r].ReduceScatter(t.Context(), send[r], recv[r], a.op) })
	for r := range p {
		ref, tol := refReduce(a.dt, a.op, ins, q.offset(r), q.offset(r)+q.count(r))
		checkNear(t, fmt.Sprintf("rank %d", r), recv[r], ref, tol)
	}
}

func testAllGather(t *testing.T, comms []*Communicator, a caseArgs) {
	p := len(comms)
	q := partition{a.n, p}
	send, recv := make([]Buffer, p), make([]Buffer, p)
	var want []byte
	for r := range p {
		send[r], _ = makeInput(a.dt, q.count(r), a.salt, r)
		want = append(want, send[r].Bytes()...)
		recv[r] = garbage(a.dt, a.n)
		if a.inPlace {
			copy(q.block(recv[r], r).Bytes(), send[r].Bytes())
			send[r] = q.block(recv[r], r)
		}
	}
	commtest.Must(t, p, nil, func(r int) error { return comms[r].AllGather(t.Context(), send[r], recv[r]) })
	for r := range p {
		checkBits(t, fmt.Sprintf("rank %d", r), recv[r].Bytes(), want)
	}
}

func testBroadcast(t *testing.T, comms []*Communicator, a caseArgs) {
	p := len(comms)
	root := a.n % p
	bufs := make([]Buffer, p)
	want, _ := makeInput(a.dt, a.n, a.salt, root)
	for r := range p {
		bufs[r] = garbage(a.dt, a.n)
		if r == root {
			copy(bufs[r].Bytes(), want.Bytes())
		}
	}
	commtest.Must(t, p, nil, func(r int) error { return comms[r].Broadcast(t.Context(), bufs[r], root) })
	for r := range p {
		checkBits(t, fmt.Sprintf("rank %d", r), bufs[r].Bytes(), want.Bytes())
	}
}

func testReduce(t *testing.T, comms []*Communicator, a caseArgs) {
	p := len(comms)
	root := (a.n + 1) % p
	send, ins := make([]Buffer, p), make([][]float64, p)
	for r := range p {
		send[r], ins[r] = makeInput(a.dt, a.n, a.salt, r)
	}
	recv := garbage(a.dt, a.n)
	if a.inPlace {
		recv = send[root]
	}
	commtest.Must(t, p, nil, func(r int) error {
		out := Buffer{}
		if r == root {
			out = recv
		}
		return comms[r].Reduce(t.Context(), send[r], out, a.op, root)
	})
	ref, tol := refReduce(a.dt, a.op, ins, 0, a.n)
	checkNear(t, fmt.Sprintf("root %d", root), recv, ref, tol)
}

func testGather(t *testing.T, comms []*Communicator, a caseArgs) {
	p := len(comms)
	root := a.n % p
	send := make([]Buffer, p)
	var want []byte
	for r := range p {
		send[r], _ = makeInput(a.dt, a.n, a.salt, r)
		want = append(want, send[r].Bytes()...)
	}
	recv := garbage(a.dt, p*a.n)
	if a.inPlace {
		copy(recv.Slice(root*a.n, (root+1)*a.n).Bytes(), send[root].Bytes())
		send[root] = recv.Slice(root*a.n, (root+1)*a.n)
	}
	commtest.Must(t, p, nil, func(r int) error {
		out := Buffer{}
		if r == root {
			out = recv
		}
		return comms[r].Gather(t.Context(), send[r], out, root)
	})
	checkBits(t, fmt.Sprintf("root %d", root), recv.Bytes(), want)
}

func testScatter(t *testing.T, comms []*Communicator, a caseArgs) {
	p := len(comms)
	root := a.n % p
	send, _ := makeInput(a.dt, p*a.n, a.salt, root)
	recv := make([]Buffer, p)
	for r := range p {
		recv[r] = garbage(a.dt, a.n)
	}
	if a.inPlace {
		recv[root] = send.Slice(root*a.n, (root+1)*a.n)
	}
	commtest.Must(t, p, nil, func(r int) error {
		in := Buffer{}
		if r == root {
			in = send
		}
		return comms[r].Scatter(t.Context(), in, recv[r], root)
	})
	for r := range p {
		checkBits(t, fmt.Sprintf("rank %d", r), recv[r].Bytes(), send.Slice(r*a.n, (r+1)*a.n).Bytes())
	}
}
