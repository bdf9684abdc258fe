package dist

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gtrain/gtrain/engine/comm"
)

// TestWriteErrorFile: the worker's error file is torch's form, which the
// agent quotes, marked peer_failed exactly when the rank failed because a
// peer's link broke.
func TestWriteErrorFile(t *testing.T) {
	tests := []struct {
		name string
		err  error
		peer bool
	}{
		{"peer process gone", fmt.Errorf("train: step 3: %w", &comm.OpError{Rank: 0, Op: "all_reduce", Seq: 3,
			Err: &comm.LinkError{Transport: "shm", Op: "recv", Peer: 1, Err: comm.ErrPeerGone}}), true},
		{"peer closed", &comm.OpError{Rank: 1, Op: "all_reduce", Err: &comm.PeerError{Peer: 0, World: -1, Err: comm.ErrPeerClosed}}, true},
		{"own failure", errors.New("train: step 3: loss is NaN"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "error.json")
			WriteErrorFile(path, tt.err)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var f struct {
				Message struct {
					Message string `json:"message"`
				} `json:"message"`
				PeerFailed bool `json:"peer_failed"`
			}
			if err := json.Unmarshal(b, &f); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			if f.Message.Message != tt.err.Error() || f.PeerFailed != tt.peer {
				t.Errorf("error file %s, want message %q and peer_failed %v", b, tt.err, tt.peer)
			}
		})
	}
	WriteErrorFile("", errors.New("no file asked for")) // must not fail
}
