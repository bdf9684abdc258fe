package flightrec

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)

// coll is a collective op; its end is seq seconds after t0 when done.
func coll(name string, seq uint64, st State, waiting int) Op {
	op := Op{Op: name, Seq: seq, To: -1, From: -1, DType: "f32", Count: 1, Bytes: 4, State: st, Waiting: waiting,
		Start: t0.Add(time.Duration(seq) * time.Second)}
	if st != Pending {
		op.End = op.Start.Add(time.Millisecond)
	}
	return op
}

func recv(from int, seq uint64, st State) Op {
	op := coll("recv", seq, st, from)
	op.P2P, op.From = true, from
	return op
}

func group(name string, ranks []int, me int, ops ...Op) Group {
	gr := -1
	for i, r := range ranks {
		if r == me {
			gr = i
		}
	}
	return Group{Name: name, Ranks: ranks, Rank: gr, Ops: ops}
}

func dump(rank int, groups ...Group) *Dump {
	return &Dump{Version: Version, Rank: rank, Host: "h" + string(rune('a'+rank)), Reason: "signal", Time: t0, Groups: groups}
}

func TestAnalyze(t *testing.T) {
	dp := []int{0, 1, 2, 3}
	inDP := func(r int) *Dump {
		return dump(r, group("dp", dp, r, coll("all_reduce", 411, Done, -1), coll("all_reduce", 412, Pending, 2)))
	}
	tp0, tp1 := []int{0, 1}, []int{2, 3}
	dp0, dp1 := []int{0, 2}, []int{1, 3}
	for _, tc := range []struct {
		name     string
		world    int
		dumps    []*Dump
		culprits []int
		want     []string // lines the report must hold
	}{{
		name:     "one rank in compute",
		world:    4,
		dumps:    []*Dump{inDP(0), inDP(1), dump(2, group("dp", dp, 2, coll("all_reduce", 411, Done, -1))), inDP(3)},
		culprits: []int{2},
		want: []string{"ranks 0,1,3 wait in all_reduce #412 of group dp (ranks 0-3) for rank 2",
			"rank 2 (host hc): its last completed op is all_reduce #411 of group dp; it has no pending op: it is not in a collective (stuck in compute?)"},
	}, {
		name:     "one rank stopped: no record",
		world:    4,
		dumps:    []*Dump{inDP(0), inDP(1), inDP(3)},
		culprits: []int{2},
		want: []string{"ranks 0,1,3 wait in all_reduce #412 of group dp (ranks 0-3) for rank 2",
			"rank 2 (host c): it wrote no flight record", "no flight record from rank 2"},
	}, {
		// Rank 1 computes; 0 waits for it in tp, 3 in dp, and 2 waits in
		// dp for 0: the chain leads to 1 alone.
		name:  "a chain across groups",
		world: 4,
		dumps: []*Dump{
			dump(0, group("tp", tp0, 0, coll("all_reduce", 5, Pending, 1)), group("dp", dp0, 0, coll("all_reduce", 2, Done, -1))),
			dump(1, group("tp", tp0, 1, coll("all_reduce", 4, Done, -1)), group("dp", dp1, 1, coll("all_reduce", 2, Done, -1))),
			dump(2, group("tp", tp1, 2, coll("all_reduce", 5, Done, -1)), group("dp", dp0, 2, coll("all_reduce", 3, Pending, 0))),
			dump(3, group("tp", tp1, 3, coll("all_reduce", 5, Done, -1)), group("dp", dp1, 3, coll("all_reduce", 3, Pending, 1))),
		},
		culprits: []int{1},
		want: []string{"rank 0 waits in all_reduce #5 of group tp (ranks 0,1) for rank 1",
			"rank 2 waits in all_reduce #3 of group dp (ranks 0,2) for rank 0",
			"rank 3 waits in all_reduce #3 of group dp (ranks 1,3) for rank 1",
			"rank 1 (host hb): its last completed op is all_reduce #4 of group tp"},
	}, {
		name:  "a receive from a rank that does not send",
		world: 2,
		dumps: []*Dump{
			dump(0, group("pp", tp0, 0, coll("all_reduce", 9, Done, -1))),
			dump(1, group("pp", tp0, 1, coll("all_reduce", 9, Done, -1), recv(0, 3, Pending))),
		},
		culprits: []int{0},
		want:     []string{"rank 1 waits in recv #3 of group pp (ranks 0,1) for rank 0", "rank 0 (host ha): its last completed op is all_reduce #9"},
	}, {
		name:  "different collectives: a cycle",
		world: 2,
		dumps: []*Dump{
			dump(0, group("world", tp0, 0, coll("broadcast", 5, Pending, 1))),
			dump(1, group("world", tp0, 1, coll("all_reduce", 5, Failed, 0))),
		},
		culprits: []int{0, 1},
		want:     []string{"rank 0 waits in broadcast #5", "rank 1 waits in all_reduce #5", "a deadlock"},
	}, {
		name:  "everyone in the call, one blocked on a peer",
		world: 2,
		dumps: []*Dump{
			dump(0, group("world", tp0, 0, coll("all_reduce", 5, Pending, 1))),
			dump(1, group("world", tp0, 1, coll("all_reduce", 5, Pending, -1))),
		},
		culprits: []int{1},
		want: []string{"ranks 0,1 wait in all_reduce #5 of group world (ranks 0,1) for rank 1",
			"rank 1 (host hb): it is in all_reduce #5 of group world (ranks 0,1), which waits for no rank in particular"},
	}, {
		name:  "nobody waits",
		world: 2,
		dumps: []*Dump{
			dump(0, group("world", tp0, 0, coll("all_reduce", 5, Done, -1))),
			dump(1, group("world", tp0, 1, coll("all_reduce", 5, Done, -1))),
		},
		want: []string{"no rank is waiting in an operation"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Analyze(tc.world, []string{"a", "b", "c", "d"}, tc.dumps)
			var got []int
			for _, c := range rep.Culprits {
				got = append(got, c.Rank)
			}
			if !equal(got, tc.culprits) {
				t.Errorf("culprits %v, want %v\n%s", got, tc.culprits, rep)
			}
			text := rep.String()
			if len(tc.want) == 0 {
				t.Fatal("the case checks no line")
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("report lacks %q:\n%s", w, text)
				}
			}
		})
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRanges(t *testing.T) {
	for in, want := range map[string]string{"0 1 2 3": "0-3", "0 2 5 6 7": "0,2,5-7", "4": "4", "1 2": "1,2", "": ""} {
		var r []int
		for _, f := range strings.Fields(in) {
			r = append(r, int(f[0]-'0'))
		}
		if got := Ranges(r); got != want {
			t.Errorf("Ranges(%v) = %q, want %q", r, got, want)
		}
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	d := dump(1, group("dp", []int{0, 1}, 1, coll("all_reduce", 3, Done, -1), recv(0, 2, Pending)))
	var buf bytes.Buffer
	if err := Encode(&buf, d); err != nil {
		t.Fatal(err)
	}
	got, err := Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Groups) != 1 || len(got.Groups[0].Ops) != 2 || !got.Groups[0].Ops[0].End.Equal(d.Groups[0].Ops[0].End) {
		t.Errorf("decoded %+v, want %+v", got, d)
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"version", `{"version":2,"rank":0,"groups":[]}`, "version 2"},
		{"rank", `{"version":1,"rank":-1,"groups":[]}`, "rank -1 out of range"},
		{"group rank", `{"version":1,"rank":0,"groups":[{"name":"dp","ranks":[1,2],"rank":0,"ops":[]}]}`, "is world rank 1"},
		{"peer", `{"version":1,"rank":0,"groups":[{"name":"dp","ranks":[0],"rank":0,"ops":[{"op":"recv","state":"pending","from":3,"to":-1,"waiting":-1}]}]}`, "outside the group"},
		{"state", `{"version":1,"rank":0,"groups":[{"name":"dp","ranks":[0],"rank":0,"ops":[{"op":"x","state":"odd","to":-1,"from":-1,"waiting":-1}]}]}`, `state "odd"`},
		{"unknown field", `{"version":1,"rank":0,"grups":[]}`, "unknown field"},
		{"too large", `{"version":1,"rank":0,"host":"` + strings.Repeat("x", MaxBytes) + `"}`, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Decode: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	var buf bytes.Buffer
	_ = Encode(&buf, dump(1, group("dp", []int{0, 1}, 1, coll("all_reduce", 3, Done, -1), recv(0, 2, Pending))))
	f.Add(buf.Bytes())
	f.Add([]byte(`{"version":1,"rank":0,"groups":[{"name":"w","ranks":[0],"rank":0,"ops":[]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		d, err := Decode(bytes.NewReader(b))
		if err != nil {
			return
		}
		rep := Analyze(d.Rank+2, nil, []*Dump{d})
		_ = rep.String()
		var out bytes.Buffer
		if err := Encode(&out, d); err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(&out); err != nil {
			t.Fatalf("re-decoding what decoded: %v", err)
		}
	})
}
