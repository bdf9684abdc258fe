package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/gtrain/gtrain/launch/proto"
)

// ForwardPrefixes are the prefixes of the launcher's environment variables
// that every rank gets, on every host, so that settings like NCCL_DEBUG or
// PYTHONPATH set where gtrain runs reach remote ranks too. Nothing else of the
// launcher's environment crosses to another host: use --env or --env-file.
var ForwardPrefixes = []string{"NCCL_", "CUDA_", "PYTHON", "TORCH", "OMP_", "MKL_", "GLOO_", "HF_", "GTRAIN_"}

// ForwardEnv returns the entries of environ that ForwardPrefixes select.
func ForwardEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		for _, p := range ForwardPrefixes {
			if strings.HasPrefix(kv, p) {
				out = append(out, kv)
				break
			}
		}
	}
	return out
}

// ReadEnvFile reads KEY=VALUE lines (blank lines and # comments allowed, an
// optional leading "export ") for --env-file. A bad line is an error naming
// the file and line.
func ReadEnvFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("launch: --env-file: %w", err)}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return nil, &UsageError{Err: fmt.Errorf("launch: %s:%d: want KEY=VALUE, got %q", path, n, line)}
		}
		if len(v) >= 2 && (v[0] == '"' && v[len(v)-1] == '"' || v[0] == '\'' && v[len(v)-1] == '\'') {
			v = v[1 : len(v)-1]
		}
		out = append(out, k+"="+v)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("launch: read %s: %w", path, err)
	}
	return out, nil
}

// Mux starts agents on this machine with Local and on other hosts with
// Remote.
type Mux struct {
	Local, Remote Transport
}

// Start implements Transport.
func (m *Mux) Start(ctx context.Context, h PlanHost, spec *proto.Spec) (AgentConn, error) {
	if h.Local {
		return m.Local.Start(ctx, h, spec)
	}
	if m.Remote == nil {
		return nil, errors.New("launch: no transport for remote host " + h.Name)
	}
	return m.Remote.Start(ctx, h, spec)
}
