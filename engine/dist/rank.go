package dist

import (
	"fmt"
	"os"
	"strconv"

	"github.com/gtrain/gtrain/internal/rankenv"
)

// Alone reports whether getenv describes a rank that has no others to join:
// started by hand (no WORLD_SIZE) or in a job of one rank. Such a rank needs
// neither a store nor a communicator, and FromEnv is not for it.
func Alone(getenv func(string) string) bool {
	ws := getenv(rankenv.WorldSize)
	return ws == "" || ws == "1"
}

// RestartCount is the launcher's TORCHELASTIC_RESTART_COUNT: 0 for the
// first attempt of a job (or a rank started alone).
func RestartCount(getenv func(string) string) int {
	n, err := strconv.Atoi(getenv(rankenv.RestartCount))
	if err != nil {
		return 0
	}
	return n
}

// StatusFile opens the agent's status pipe, the file descriptor named by
// GTRAIN_STATUS_FD; nil when the variable is unset (no agent, or one that
// shows no live table). The caller closes it.
func StatusFile(getenv func(string) string) (*os.File, error) {
	s := getenv(rankenv.StatusFD)
	if s == "" {
		return nil, nil
	}
	fd, err := strconv.Atoi(s)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: want a file descriptor number ≥ 3", rankenv.StatusFD, s)
	}
	return os.NewFile(uintptr(fd), "status"), nil
}
