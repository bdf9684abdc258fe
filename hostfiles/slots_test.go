package hostfiles

import (
	"errors"
	"strings"
	"testing"
)

// TestParseSlots: with a SlotsFunc (--nproc-per-node gpu|auto), a host
// written without slots takes the count it gives; every other rule of the
// hostfile stays as strict.
func TestParseSlots(t *testing.T) {
	count := func(h Host) (int, error) {
		switch h.Name {
		case "gpu-box":
			return 8, nil
		case "huge":
			return MaxSlotsPerHost + 1, nil
		}
		return 0, errors.New("cannot count the GPUs of " + h.Name + ": add slots=N")
	}
	hosts, err := ParseSlots("h", strings.NewReader("gpu-box\nalice@other slots=2\n"), count)
	if err != nil {
		t.Fatal(err)
	}
	if len(hosts) != 2 || hosts[0].Slots != 8 || hosts[1].Slots != 2 || hosts[1].User != "alice" {
		t.Errorf("hosts = %+v, want gpu-box with 8 slots (counted) and other with 2 (written)", hosts)
	}
	tests := []struct{ name, file, want string }{
		{"the count fails", "ok slots=1\nremote\n", "h:2: cannot count the GPUs of remote"},
		{"more than max_slots", "gpu-box max_slots=4\n", "8 slots by --nproc-per-node, more than its max_slots=4"},
		{"more than a host may have", "huge\n", "want 1 to 1024"},
		{"duplicates stay an error", "gpu-box\ngpu-box\n", "duplicate host"},
		{"unknown keys stay an error", "gpu-box gpus=8\n", "unknown key"},
		{"host:X with keys is still a port without slots", "gpu-box:2222 max_slots=8\n", "missing slots="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseSlots("h", strings.NewReader(tt.file), count)
			var pe *ParseError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseSlots = %v, want a ParseError containing %q", err, tt.want)
			}
		})
	}
	if _, err := Parse("h", strings.NewReader("gpu-box\n")); err == nil || !strings.Contains(err.Error(), `missing slot count for "gpu-box": add slots=N`) {
		t.Errorf("Parse without a SlotsFunc = %v, want the missing slot count", err)
	}
}
