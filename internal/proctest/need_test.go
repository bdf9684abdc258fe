package proctest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// recordTB records what Missing did instead of ending the test.
type recordTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordTB) Helper()                   {}
func (r *recordTB) Skipf(f string, a ...any)  { r.skipped = fmt.Sprintf(f, a...) }
func (r *recordTB) Fatalf(f string, a ...any) { r.failed = fmt.Sprintf(f, a...) }

// TestMissing: a missing dependency skips the test, except under CI=true
// (any true spelling) or with the dependency's GTRAIN_REQUIRE_* set to 1,
// where it fails it; both messages say what is missing and which variable
// decides.
func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		name, ci, require string
		fail              bool
	}{
		{"nothing set", "", "", false},
		{"CI=true", "true", "", true},
		{"CI=1", "1", "", true},
		{"CI=false", "false", "", false},
		{"CI=nonsense", "nonsense", "", false},
		{"require=1", "", "1", true},
		{"require=0", "", "0", false},
		{"CI=false require=1", "false", "1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			t.Setenv("GTRAIN_REQUIRE_THING", tc.require)
			r := &recordTB{TB: t}
			Missing(r, "GTRAIN_REQUIRE_THING", errors.New("no thing: apt-get install thing"))
			got, other := r.skipped, r.failed
			if tc.fail {
				got, other = r.failed, r.skipped
			}
			if other != "" || !strings.Contains(got, "no thing: apt-get install thing") || !strings.Contains(got, "GTRAIN_REQUIRE_THING=1") {
				t.Errorf("skipped %q, failed %q; want only a %s naming the dependency and GTRAIN_REQUIRE_THING=1",
					r.skipped, r.failed, map[bool]string{false: "skip", true: "failure"}[tc.fail])
			}
		})
	}
}

// TestNeedTorchAgrees: NeedTorch either returns an interpreter that
// imports torch.distributed or ends the test; a returned path is never empty.
func TestNeedTorchAgrees(t *testing.T) {
	py, err := torchPython()
	if (py == "") == (err == nil) {
		t.Fatalf("torchPython() = %q, %v: want a path or an error, not both or neither", py, err)
	}
	if err != nil && !strings.Contains(err.Error(), "python3-torch") {
		t.Errorf("error %q does not say how to install torch", err)
	}
}
