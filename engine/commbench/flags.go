package commbench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/usage"
)

// Flags are the settings of `gtrain bench collectives` as its command line
// spells them; ParseConfig checks them.
type Flags struct {
	Collectives []string // names, or "all"
	DType       string
	Op          string
	Root        int
	MinBytes    string // a size: 4096, 64K, 256M, 1G
	MaxBytes    string
	StepFactor  int64
	Iters       int
	Warmup      int
	Check       bool
	Algorithm   string // auto, ring, rd, tree or direct
	Timeout     time.Duration
}

// Algorithms are the values of Flags.Algorithm: comm's choice (auto), or
// one algorithm forced for comparisons.
var Algorithms = []string{"auto", "ring", "rd", "tree", "direct"}

// RankConfig is what every rank of the benchmark is given: what to measure,
// and how its communicator runs.
type RankConfig struct {
	Config
	Algorithm string        // comm.Options.Algorithm
	Timeout   time.Duration // the longest one operation may take before it fails, naming the peer
}

// ParseConfig checks f and turns it into a RankConfig. Bad values are
// usage errors (exit 2) naming the flag.
func ParseConfig(f Flags) (RankConfig, error) {
	usage := func(err error) error { return usage.Errorf("bench collectives: %w", err) }
	rc := RankConfig{Algorithm: f.Algorithm, Timeout: f.Timeout,
		Config: Config{Root: f.Root, StepFactor: f.StepFactor, Iters: f.Iters, Warmup: f.Warmup, Check: f.Check}}
	cfg := &rc.Config
	for _, c := range f.Collectives {
		if c == "all" {
			cfg.Collectives = append(cfg.Collectives, Collectives...)
		} else if !slices.Contains(Collectives, c) {
			return rc, usage(fmt.Errorf("--collectives: unknown collective %q (want all, or some of %s)", c, strings.Join(Collectives, ", ")))
		} else {
			cfg.Collectives = append(cfg.Collectives, c)
		}
	}
	var err error
	if cfg.DType, err = comm.ParseDType(f.DType); err != nil {
		return rc, usage(fmt.Errorf("--dtype: %w", err))
	}
	if cfg.Op, err = comm.ParseOp(f.Op); err != nil {
		return rc, usage(fmt.Errorf("--op: %w", err))
	}
	if cfg.MinBytes, err = ParseBytes(f.MinBytes); err != nil {
		return rc, usage(fmt.Errorf("--min-bytes: %w", err))
	}
	if cfg.MaxBytes, err = ParseBytes(f.MaxBytes); err != nil {
		return rc, usage(fmt.Errorf("--max-bytes: %w", err))
	}
	if err := f.checkCounts(cfg); err != nil {
		return rc, usage(err)
	}
	if !slices.Contains(Algorithms, f.Algorithm) {
		return rc, usage(fmt.Errorf("--algorithm %q: want auto, ring, rd, tree or direct", f.Algorithm))
	}
	return rc, nil
}

// checkCounts checks the sizes (parsed into cfg) and the counts of f.
func (f Flags) checkCounts(cfg *Config) error {
	switch {
	case cfg.MinBytes < 1 || cfg.MaxBytes < cfg.MinBytes:
		return fmt.Errorf("--min-bytes %s and --max-bytes %s: want 1 <= min <= max", f.MinBytes, f.MaxBytes)
	case cfg.MaxBytes > maxBytes:
		return fmt.Errorf("--max-bytes %s: at most 16G", f.MaxBytes)
	case f.StepFactor < 2:
		return fmt.Errorf("--step-factor %d: want 2 or more", f.StepFactor)
	case f.Iters < 0:
		return fmt.Errorf("--iters %d: want 0 (auto) or more", f.Iters)
	case f.Warmup < -1:
		return fmt.Errorf("--warmup %d: want -1 (auto) or more", f.Warmup)
	case f.Root < 0:
		return fmt.Errorf("--root %d: must not be negative", f.Root)
	case f.Timeout <= 0:
		return fmt.Errorf("--timeout %v: must be positive", f.Timeout)
	}
	return nil
}

// maxBytes is the largest message the benchmark times, as Config.validate
// allows.
const maxBytes = 16 << 30

// ParseBytes reads a size: a number with an optional K, M or G (powers of
// 1024, with or without "iB" or "B").
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult > 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > (1<<40)/mult {
		return 0, fmt.Errorf("%q is not a size (e.g. 4096, 64K, 256M, 1G)", s)
	}
	return v * mult, nil
}
