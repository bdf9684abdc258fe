package launch

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
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

// MaxEnvVars bounds the variables of one --env-file. Every rank gets its
// own copy of them, and real environments have tens of variables.
const MaxEnvVars = 1024

// ReadEnvFile reads KEY=VALUE lines (blank lines and # comments allowed, an
// optional leading "export ") for --env-file. A bad line is an error naming
// the file and line. A file larger than [userfile.ConfigLimit] or with more
// than [MaxEnvVars] variables is refused, and ReadEnvFile returns
// context.Cause(ctx) as soon as ctx is done, even while the file blocks (a
// FIFO).
func ReadEnvFile(ctx context.Context, path string) ([]string, error) {
	b, err := userfile.Read(ctx, path, userfile.ConfigLimit)
	if err != nil {
		var ue *userfile.Error
		if errors.As(err, &ue) {
			err = usage.Errorf("launch: --env-file %w", err)
		} else if ctx.Err() == nil {
			err = fmt.Errorf("launch: --env-file: %w", err)
		}
		return nil, err
	}
	return ParseEnv(path, b)
}

// ParseEnv parses the contents of an env file (see [ReadEnvFile]); name is
// used in error messages only.
func ParseEnv(name string, data []byte) ([]string, error) {
	var out []string
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return nil, usage.Errorf("launch: %s:%d: want KEY=VALUE, got %q", name, i+1, clip(line, 60))
		}
		if len(v) >= 2 && (v[0] == '"' && v[len(v)-1] == '"' || v[0] == '\'' && v[len(v)-1] == '\'') {
			v = v[1 : len(v)-1]
		}
		if len(out) == MaxEnvVars {
			return nil, usage.Errorf("launch: %s:%d: more than %d variables, the most an env file may set: is it the right file?", name, i+1, MaxEnvVars)
		}
		out = append(out, k+"="+v)
	}
	return out, nil
}

// clip shortens s to at most n bytes for an error message: a "line" of a
// binary file may be megabytes long.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
