package data

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// ramp is n tokens whose ids are their offsets, so a row's first input is
// the window's offset.
func ramp(n int) *Tokens {
	toks := make([]uint16, n)
	for i := range toks {
		toks[i] = uint16(i)
	}
	return NewTokens(toks)
}

// draw returns the next batch of s.
func draw(t *testing.T, s *Sampler) (x, y []int32) {
	t.Helper()
	n := s.cfg.Batch * s.cfg.Seq
	x, y = make([]int32, n), make([]int32, n)
	if err := s.Next(x, y); err != nil {
		t.Fatal(err)
	}
	return x, y
}

func newSampler(t *testing.T, src *Tokens, cfg SamplerConfig) *Sampler {
	t.Helper()
	s, err := NewSampler(src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSamplerWindows(t *testing.T) {
	const B, T, n = 8, 16, 100
	s := newSampler(t, ramp(n), SamplerConfig{Seed: 1, Batch: B, Seq: T, World: 1})
	for range 50 {
		x, y := draw(t, s)
		for r := range B {
			off := int(x[r*T])
			if off < 0 || off > n-T-1 {
				t.Fatalf("offset %d outside [0, %d]", off, n-T-1)
			}
			for i := range T {
				if x[r*T+i] != int32(off+i) || y[r*T+i] != int32(off+i+1) {
					t.Fatalf("row %d: x, y at %d = %d, %d; want %d, %d", r, i, x[r*T+i], y[r*T+i], off+i, off+i+1)
				}
			}
		}
	}
}

// TestSamplerGolden pins the stream of a seed: a change here means resumed
// runs would see other data than the runs they resume.
func TestSamplerGolden(t *testing.T) {
	s := newSampler(t, ramp(5000), SamplerConfig{Seed: 1337, Batch: 4, Seq: 8, World: 1})
	var got [][]int32
	for range 2 {
		x, _ := draw(t, s)
		got = append(got, []int32{x[0], x[8], x[16], x[24]})
	}
	want := [][]int32{{4692, 1316, 2458, 2901}, {1108, 3436, 656, 1143}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("offsets = %v, want %v", got, want)
	}
}

func TestSamplerDeterministic(t *testing.T) {
	cfg := SamplerConfig{Seed: 42, Batch: 4, Seq: 8, World: 1}
	a, b := newSampler(t, ramp(3000), cfg), newSampler(t, ramp(3000), cfg)
	cfg.Seed = 43
	c := newSampler(t, ramp(3000), cfg)
	differ := false
	for range 20 {
		xa, ya := draw(t, a)
		xb, yb := draw(t, b)
		xc, _ := draw(t, c)
		if !slices.Equal(xa, xb) || !slices.Equal(ya, yb) {
			t.Fatal("two samplers with the same seed drew different batches")
		}
		differ = differ || !slices.Equal(xa, xc)
	}
	if !differ {
		t.Error("seeds 42 and 43 drew the same batches")
	}
}

// TestSamplerResume: a sampler restored from a (JSON round-tripped) state
// continues with the batches of the uninterrupted one.
func TestSamplerResume(t *testing.T) {
	cfg := SamplerConfig{Seed: 7, Batch: 3, Seq: 5, Rank: 1, World: 2}
	tests := []struct {
		name string
		stop int // draws before the checkpoint
	}{
		{"from the start", 0},
		{"after one draw", 1},
		{"after many draws", 17},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			whole := newSampler(t, ramp(1000), cfg)
			var want [][]int32
			for range tt.stop + 10 {
				x, _ := draw(t, whole)
				want = append(want, x)
			}
			first := newSampler(t, ramp(1000), cfg)
			for range tt.stop {
				draw(t, first)
			}
			js, err := json.Marshal(first.State())
			if err != nil {
				t.Fatal(err)
			}
			var st SamplerState
			if err := json.Unmarshal(js, &st); err != nil {
				t.Fatal(err)
			}
			other := cfg
			other.Seed = 999 // the state's seed wins
			resumed := newSampler(t, ramp(1000), other)
			if err := resumed.Restore(st); err != nil {
				t.Fatal(err)
			}
			for i := tt.stop; i < tt.stop+10; i++ {
				if x, _ := draw(t, resumed); !slices.Equal(x, want[i]) {
					t.Fatalf("draw %d after resuming (state %s) differs", i, js)
				}
			}
		})
	}
}

// TestSamplerRankUnion: the ranks' rows of a draw, in rank order, are the
// world-size-1 batch of the same global size.
func TestSamplerRankUnion(t *testing.T) {
	const T = 6
	tests := []struct {
		name         string
		world, batch int
	}{
		{"2 ranks", 2, 4},
		{"4 ranks", 4, 2},
		{"8 ranks of 1 row", 8, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			global := newSampler(t, ramp(4000), SamplerConfig{Seed: 3, Batch: tt.world * tt.batch, Seq: T, World: 1})
			ranks := make([]*Sampler, tt.world)
			for r := range ranks {
				ranks[r] = newSampler(t, ramp(4000), SamplerConfig{Seed: 3, Batch: tt.batch, Seq: T, Rank: r, World: tt.world})
			}
			for d := range 5 {
				wantX, wantY := draw(t, global)
				var gotX, gotY []int32
				for _, s := range ranks {
					x, y := draw(t, s)
					gotX, gotY = append(gotX, x...), append(gotY, y...)
				}
				if !slices.Equal(gotX, wantX) || !slices.Equal(gotY, wantY) {
					t.Fatalf("draw %d: the ranks' rows are not the global batch", d)
				}
			}
		})
	}
}

func TestSamplerNoAlloc(t *testing.T) {
	s := newSampler(t, ramp(2000), SamplerConfig{Seed: 1, Batch: 4, Seq: 32, Rank: 1, World: 2})
	x, y := make([]int32, 4*32), make([]int32, 4*32)
	if allocs := testing.AllocsPerRun(100, func() { _ = s.Next(x, y) }); allocs != 0 {
		t.Errorf("Next allocates %v times per call, want 0", allocs)
	}
}

func TestSamplerErrors(t *testing.T) {
	file := NewTokens(make([]uint16, 10))
	file.name = "train.bin"
	tests := []struct {
		name string
		src  *Tokens
		cfg  SamplerConfig
		want string
	}{
		{"no tokens", nil, SamplerConfig{Batch: 1, Seq: 1, World: 1}, "no tokens"},
		{"zero batch", file, SamplerConfig{Batch: 0, Seq: 1, World: 1}, "batch size 0"},
		{"zero seq", file, SamplerConfig{Batch: 1, Seq: 0, World: 1}, "sequence length 0"},
		{"zero world", file, SamplerConfig{Batch: 1, Seq: 1, World: 0}, "world size 0"},
		{"rank too large", file, SamplerConfig{Batch: 1, Seq: 1, Rank: 2, World: 2}, "rank 2: want 0 to 1"},
		{"negative rank", file, SamplerConfig{Batch: 1, Seq: 1, Rank: -1, World: 2}, "rank -1"},
		{"too large", file, SamplerConfig{Batch: 1 << 20, Seq: 1 << 20, World: 1}, "too large"},
		{"file too short", file, SamplerConfig{Batch: 1, Seq: 10, World: 1}, "data: train.bin: 10 tokens, too few for sequence length 10: need at least 11"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSampler(tt.src, tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewSampler = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	s := newSampler(t, file, SamplerConfig{Batch: 2, Seq: 9, World: 1})
	if err := s.Next(make([]int32, 3), make([]int32, 18)); err == nil || !strings.Contains(err.Error(), "want 18") {
		t.Errorf("Next with a short buffer = %v", err)
	}
	if err := s.Restore(SamplerState{Draws: -1}); err == nil {
		t.Error("Restore of -1 draws succeeded")
	}
	file.Close()
	if err := s.Next(make([]int32, 18), make([]int32, 18)); err == nil || !strings.Contains(err.Error(), "train.bin") {
		t.Errorf("Next after Close = %v, want an error naming the file", err)
	}
}
