package zero

import (
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/model"
)

// Segment is a contiguous run of whole units of the flat parameter layout:
// what one collective moves. Stages 0–2 group units into buckets (Buckets);
// stage 3 makes every unit its own segment, so that a layer is gathered on
// its own.
type Segment struct {
	Offset, Size int
	First, Last  int // the units it holds, inclusive
}

// Buckets groups units into segments the way gradients become ready:
// backward produces the last unit first, so the segments are cut from the
// end of the layout. The first bucket to fill (the one holding the end)
// closes once it has at least first elements, later ones at size, as
// PyTorch DDP sizes its buckets: a small first bucket starts communication
// early. Units are never split. The result is in flat order.
func Buckets(units []model.Unit, first, size int) []Segment {
	var rev []Segment
	limit := max(first, 1)
	cur := Segment{First: -1}
	for u := len(units) - 1; u >= 0; u-- {
		if cur.First < 0 {
			cur = Segment{Offset: units[u].Offset + units[u].Size, Last: u}
		}
		cur.Offset -= units[u].Size
		cur.Size += units[u].Size
		cur.First = u
		if cur.Size >= limit || u == 0 {
			rev = append(rev, cur)
			cur = Segment{First: -1}
			limit = max(size, 1)
		}
	}
	segs := make([]Segment, len(rev))
	for i, s := range rev {
		segs[len(rev)-1-i] = s
	}
	return segs
}

// PerUnit makes every unit a segment.
func PerUnit(units []model.Unit) []Segment {
	segs := make([]Segment, len(units))
	for i, u := range units {
		segs[i] = Segment{Offset: u.Offset, Size: u.Size, First: i, Last: i}
	}
	return segs
}

// Partition says which elements of the flat layout a rank owns: block
// Rank of every segment split over Ranks. With Ranks 1 a rank owns
// everything (stage 0). Owned elements are stored compactly, segment after
// segment.
type Partition struct {
	Segments    []Segment
	Ranks, Rank int
	at          []int // compact offset of each segment's owned block
	owned       int
}

// NewPartition is rank's partition of segs over ranks.
func NewPartition(segs []Segment, ranks, rank int) Partition {
	p := Partition{Segments: segs, Ranks: ranks, Rank: rank, at: make([]int, len(segs))}
	for i, s := range segs {
		p.at[i] = p.owned
		lo, hi := comm.Block(s.Size, rank, ranks)
		p.owned += hi - lo
	}
	return p
}

// Owned is the absolute flat range of segment i this rank owns, and where
// it starts in the compact owned storage.
func (p Partition) Owned(i int) (lo, hi, at int) {
	s := p.Segments[i]
	lo, hi = comm.Block(s.Size, p.Rank, p.Ranks)
	return s.Offset + lo, s.Offset + hi, p.at[i]
}

// Size is the number of elements this rank owns.
func (p Partition) Size() int { return p.owned }

// piece is a run of owned elements within one parameter tensor: the unit
// of optimizer updates (one weight-decay setting) and of checkpoint shards.
type piece struct {
	param model.Param
	lo, n int // flat offset and length
	at    int // compact offset in the owned storage
}

// pieces cuts the owned ranges of p at parameter boundaries, in flat order.
func (p Partition) pieces(params []model.Param) []piece {
	var ps []piece
	j := 0
	for i := range p.Segments {
		lo, hi, at := p.Owned(i)
		for lo < hi {
			for params[j].Offset+params[j].Size() <= lo {
				j++
			}
			end := min(hi, params[j].Offset+params[j].Size())
			ps = append(ps, piece{param: params[j], lo: lo, n: end - lo, at: at})
			at += end - lo
			lo = end
		}
	}
	return ps
}
