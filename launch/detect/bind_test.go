//go:build linux && cgo

package detect_test

import (
	"fmt"
	"testing"

	"github.com/gtrain/gtrain/launch"
	"github.com/gtrain/gtrain/launch/detect"
)

// TestCoreBindingKeepsCores: on the detected DGX H100-like host (two
// hardware threads per core), --bind core never gives two ranks the two
// threads of one core, for any number of ranks on its GPUs: the
// siblings detection reads are what the binding groups CPUs by.
func TestCoreBindingKeepsCores(t *testing.T) {
	h := detect.DGXFixture(t)
	if len(h.CPU.Siblings) != 8 {
		t.Fatalf("siblings %v: want the 8 cores of the fixture", h.CPU.Siblings)
	}
	for ranks := 1; ranks <= 8; ranks++ {
		t.Run(fmt.Sprintf("%d ranks", ranks), func(t *testing.T) {
			slots := make([]int, ranks)
			for i := range slots {
				slots[i] = i
			}
			bs, err := launch.PlanBinding(&h, launch.BindCore, slots)
			if err != nil {
				t.Fatal(err)
			}
			owner := map[int]int{} // CPU → local rank
			for r, b := range bs {
				if len(b.CPUs) == 0 {
					t.Fatalf("rank %d bound to no CPU", r)
				}
				for _, c := range b.CPUs {
					owner[c] = r
				}
			}
			for _, core := range h.CPU.Siblings {
				r0, ok := owner[core[0]]
				for _, c := range core[1:] {
					if r, ok2 := owner[c]; ok && ok2 && r != r0 {
						t.Errorf("core %v split: CPU %d to rank %d, CPU %d to rank %d", core, core[0], r0, c, r)
					}
				}
			}
		})
	}
}
