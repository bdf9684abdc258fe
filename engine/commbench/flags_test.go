package commbench

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/usage"
)

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"8", 8}, {"4K", 4 << 10}, {"64k", 64 << 10}, {"256M", 256 << 20}, {"1G", 1 << 30},
		{"2KiB", 2 << 10}, {"3MB", 3 << 20}, {" 16G ", 16 << 30}, {"0", 0}, {"1024G", 1 << 40},
	} {
		if got, err := ParseBytes(tc.in); err != nil || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "12Q", "-1", "1.5M", "K", "1025G", "99999999999999999999"} {
		if got, err := ParseBytes(in); err == nil || !strings.Contains(err.Error(), "is not a size") {
			t.Errorf("ParseBytes(%q) = %d, %v; want an error saying it is not a size", in, got, err)
		}
	}
}

// defaultFlags are the defaults of gtrain bench collectives.
func defaultFlags() Flags {
	return Flags{Collectives: []string{"all_reduce"}, DType: "float32", Op: "sum", MinBytes: "8", MaxBytes: "64M",
		StepFactor: 2, Warmup: -1, Check: true, Algorithm: "auto", Timeout: time.Minute}
}

func TestParseConfig(t *testing.T) {
	f := defaultFlags()
	f.Collectives, f.DType, f.Op, f.MinBytes, f.Algorithm = []string{"all", "sendrecv"}, "bf16", "avg", "1K", "ring"
	rc, err := ParseConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(rc.Collectives) != len(Collectives)+1 || rc.DType != comm.BFloat16 || rc.Op != comm.Avg ||
		rc.MinBytes != 1<<10 || rc.MaxBytes != 64<<20 || rc.Algorithm != "ring" || rc.Timeout != time.Minute {
		t.Errorf("config %+v", rc)
	}
	for _, tc := range []struct {
		name string
		edit func(*Flags)
		want string
	}{
		{"unknown collective", func(f *Flags) { f.Collectives = []string{"alltoall"} }, `--collectives: unknown collective "alltoall"`},
		{"dtype", func(f *Flags) { f.DType = "int8" }, `--dtype: unknown dtype "int8"`},
		{"op", func(f *Flags) { f.Op = "prod" }, "--op: "},
		{"size", func(f *Flags) { f.MaxBytes = "12Q" }, `--max-bytes: "12Q" is not a size`},
		{"min over max", func(f *Flags) { f.MinBytes, f.MaxBytes = "1M", "1K" }, "want 1 <= min <= max"},
		{"too large", func(f *Flags) { f.MaxBytes = "17G" }, "--max-bytes 17G: at most 16G"},
		{"step factor", func(f *Flags) { f.StepFactor = 1 }, "--step-factor 1"},
		{"iters", func(f *Flags) { f.Iters = -1 }, "--iters -1"},
		{"warmup", func(f *Flags) { f.Warmup = -2 }, "--warmup -2"},
		{"root", func(f *Flags) { f.Root = -1 }, "--root -1"},
		{"timeout", func(f *Flags) { f.Timeout = 0 }, "--timeout 0s"},
		{"algorithm", func(f *Flags) { f.Algorithm = "fast" }, `--algorithm "fast"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := defaultFlags()
			tc.edit(&f)
			_, err := ParseConfig(f)
			if err == nil || !strings.HasPrefix(err.Error(), "bench collectives: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming the command and saying %q", err, tc.want)
			}
			if !errors.As(err, new(*usage.Error)) {
				t.Errorf("error %v is not a usage error (exit 2)", err)
			}
		})
	}
}
