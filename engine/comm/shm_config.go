package comm

// SHM defaults. A link maps two rings and a header page, so with the
// default ring it takes 2 MiB + 4 KiB of the segment directory: a host with
// n ranks needs n(n-1)/2 links per group (world and each Split). Larger
// rings measured no faster (see shm_bench_test.go).
const (
	DefaultSHMDir       = "/dev/shm"
	DefaultSHMRingBytes = 1 << 20
	minSHMRingBytes     = 4 << 10
)

// SHMConfig configures NewSHM.
type SHMConfig struct {
	Rank, Size int
	Store      Store
	Prefix     string // store key namespace for this job and attempt
	// Dir holds the segment files while the two ranks of a pair map them;
	// default /dev/shm. The files are unlinked as soon as both have.
	Dir string
	// RingBytes is the size of each direction's ring, rounded up to a
	// power of two, at least 4 KiB (default 1 MiB). Longer messages stream
	// through it.
	RingBytes int
}

func (c SHMConfig) withDefaults() (SHMConfig, error) {
	if err := linkCheckRank(c.Rank, c.Size, c.Store); err != nil {
		return c, err
	}
	if c.Dir == "" {
		c.Dir = DefaultSHMDir
	}
	if c.RingBytes == 0 {
		c.RingBytes = DefaultSHMRingBytes
	}
	n := minSHMRingBytes
	for n < c.RingBytes {
		n *= 2
	}
	c.RingBytes = n
	return c, nil
}
