package launch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/internal/usage"
)

func TestReadEnvFile(t *testing.T) {
	tests := []struct {
		name, body string
		want       []string
		wantErr    string
	}{
		{"forms", "# comment\n\nA=1\nexport B=two words\nC=\"quoted\"\nD='single'\nE=\nF=a=b\n",
			[]string{"A=1", "B=two words", "C=quoted", "D=single", "E=", "F=a=b"}, ""},
		{"no equals", "A=1\nJUNK\n", nil, "env:2: want KEY=VALUE"},
		{"space in key", "MY VAR=1\n", nil, "env:1:"},
		{"empty key", "=1\n", nil, "env:1:"},
		{"long junk line clipped", strings.Repeat("x", 1000), nil, `env:1: want KEY=VALUE, got "` + strings.Repeat("x", 60) + `..."`},
		{"too many variables", strings.Repeat("A=1\n", MaxEnvVars+1), nil, "env:1025: more than 1024 variables"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "env")
			if err := os.WriteFile(path, []byte(tt.body), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := ReadEnvFile(context.Background(), path)
			if tt.wantErr != "" {
				var ue *usage.Error
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ReadEnvFile = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	for _, path := range []string{filepath.Join(t.TempDir(), "missing"), "/dev/zero", t.TempDir()} {
		_, err := ReadEnvFile(context.Background(), path)
		var ue *usage.Error
		if !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), "launch: --env-file "+path+": ") {
			t.Errorf("ReadEnvFile(%s) = %v, want a usage error naming the file", path, err)
		}
	}
}

func TestForwardEnv(t *testing.T) {
	in := []string{"NCCL_DEBUG=INFO", "PATH=/bin", "PYTHONPATH=/x", "HOME=/root", "CUDA_HOME=/c", "MY_NCCL=1", "GTRAIN_X=1", "TORCH_HOME=/t"}
	want := []string{"NCCL_DEBUG=INFO", "PYTHONPATH=/x", "CUDA_HOME=/c", "GTRAIN_X=1", "TORCH_HOME=/t"}
	if got := ForwardEnv(in); !reflect.DeepEqual(got, want) {
		t.Errorf("ForwardEnv = %q, want %q", got, want)
	}
}
