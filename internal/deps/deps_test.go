// Package deps holds the test that enforces the import boundaries of
// docs/architecture.md: which package may depend on which.
package deps

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/gtrain/gtrain"

// forbidden maps a package prefix (relative to the module) to the import
// prefixes none of its packages may depend on, directly or transitively.
var forbidden = map[string][]string{
	"hostfiles":  {"golang.org/x/crypto/ssh", module + "/engine", module + "/launch", "github.com/spf13/"},
	"launch":     {module + "/engine", module + "/planner", "github.com/spf13/"},
	"rendezvous": {module + "/launch", module + "/engine", "github.com/spf13/"},
	"engine":     {module + "/launch", module + "/cmd", "github.com/spf13/"},
	"planner":    {"github.com/NVIDIA/go-nvml", "golang.org/x/crypto/ssh", "github.com/charmbracelet/", module + "/launch", "os/exec", "net"},

	// Shared by the engine and the launcher: the standard library only.
	"internal/atomicfile": {module + "/", "github.com/", "golang.org/"},
}

// TestImportBoundaries fails when a package reaches across a boundary of the
// design, e.g. the pure planner importing NVML or the launcher the engine.
func TestImportBoundaries(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps=false", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, deps := fields[0], fields[1:]
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		for owner, bans := range forbidden {
			if rel != owner && !strings.HasPrefix(rel, owner+"/") {
				continue
			}
			checked++
			for _, d := range deps {
				for _, ban := range bans {
					if d == ban || strings.HasPrefix(d, strings.TrimSuffix(ban, "/")+"/") {
						t.Errorf("%s depends on %s; %s must not import %s (see docs/architecture.md)", pkg, d, owner, ban)
					}
				}
			}
		}
	}
	if checked < len(forbidden) {
		t.Errorf("checked %d packages, want at least one for each of %d rules: is the module layout as designed?", checked, len(forbidden))
	}
}
