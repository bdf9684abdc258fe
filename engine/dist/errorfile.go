package dist

import (
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
)

// WriteErrorFile records err in the rank's TORCHELASTIC_ERROR_FILE (path),
// in the form torch's @record writes, so that the launcher's failure report
// quotes it; "peer_failed" tells the launcher the rank failed only because a
// peer died, so it blames the peer. Best effort: the exit code says the
// rest. An empty path (no launcher asked for the file) writes nothing.
func WriteErrorFile(path string, err error) {
	if path == "" {
		return
	}
	type message struct {
		Message   string            `json:"message"`
		ExtraInfo map[string]string `json:"extraInfo"`
	}
	b, jerr := json.Marshal(struct {
		Message    message `json:"message"`
		PeerFailed bool    `json:"peer_failed,omitempty"`
	}{
		Message:    message{Message: err.Error(), ExtraInfo: map[string]string{"timestamp": strconv.FormatInt(time.Now().Unix(), 10)}},
		PeerFailed: peerFailed(err),
	})
	if jerr == nil {
		_ = os.WriteFile(path, b, 0o600)
	}
}

// peerFailed says whether err is this rank's reaction to a peer's failure:
// the link to a peer closed, its process is gone, or it stopped answering.
func peerFailed(err error) bool {
	var pe *comm.PeerError
	return errors.As(err, &pe) || errors.Is(err, comm.ErrPeerGone) || errors.Is(err, comm.ErrPeerClosed)
}
