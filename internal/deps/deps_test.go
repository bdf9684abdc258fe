// Package deps holds the test that enforces the import boundaries of
// docs/architecture.md: which package may depend on which.
package deps

import (
	"os/exec"
	"slices"
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

	// Job files (viper) for the launcher and a rank started alone.
	"internal/jobfile": {module + "/launch", module + "/cmd"},

	// Shared by the engine, the launcher and the CLI: the standard library only.
	"internal/atomicfile": {module + "/", "github.com/", "golang.org/"},
	"internal/userfile":   {module + "/", "github.com/", "golang.org/"},
	"internal/usage":      {module + "/", "github.com/", "golang.org/"},
	"internal/rankenv":    {module + "/", "github.com/", "golang.org/"},
	"internal/hostinfo":   {module + "/", "github.com/", "golang.org/"},
	"internal/flightrec":  {module + "/", "github.com/", "golang.org/"},
}

// allowed are exceptions to a rule of forbidden: the planner may use
// net/netip, the address value type the hostfile parser returns (no
// sockets, no I/O), while net itself stays out.
var allowed = map[string][]string{
	"planner": {"net/netip"},
}

// testOnly are what only tests may depend on: no package of the module
// may, except testHelpers, the packages that exist for tests. `go list`
// gives the dependencies of a package's own build, without its _test.go
// files, so a test importing them is fine.
var (
	testOnly = []string{
		"testing", // and testing/synctest, testing/fstest, ...
		module + "/internal/netns",
		module + "/internal/proctest",
		module + "/internal/etcdtest",
		module + "/engine/comm/commtest",
		module + "/internal/tfevents/tfeventstest",
		module + "/internal/slurmtest",
		"github.com/rogpeppe/go-internal/testscript",
	}
	testHelpers = []string{"internal/netns", "internal/proctest", "engine/comm/commtest", "internal/etcdtest", "internal/tfevents/tfeventstest", "internal/slurmtest"}
)

// TestImportBoundaries fails when a package reaches across a boundary of the
// design, e.g. the pure planner importing NVML, the launcher the engine, or
// a command the testing package.
func TestImportBoundaries(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps=false", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	checked := map[string]int{} // rule → packages it covered
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, deps := fields[0], fields[1:]
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		for owner, bans := range forbidden {
			if rel != owner && !strings.HasPrefix(rel, owner+"/") {
				continue
			}
			checked[owner]++
			for _, b := range banned(slices.DeleteFunc(slices.Clone(deps), func(d string) bool { return slices.Contains(allowed[owner], d) }), bans) {
				t.Errorf("%s depends on %s; %s must not import %s (see docs/architecture.md)", pkg, b.dep, owner, b.ban)
			}
		}
		if slices.Contains(testHelpers, rel) {
			continue
		}
		checked["production"]++
		for _, b := range banned(deps, testOnly) {
			t.Errorf("%s depends on %s; only tests may import %s (production code carries no test helpers)", pkg, b.dep, b.ban)
		}
	}
	for owner := range forbidden {
		if checked[owner] == 0 {
			t.Errorf("no package for the rule on %s: is the module layout as designed?", owner)
		}
	}
	if checked["production"] == 0 {
		t.Error("no production package checked: is the module layout as designed?")
	}
}

// importedOnlyBy maps an import prefix to the one package that may import
// it directly: go-nvml needs cgo and dlopens the driver's library, so
// launch/detect wraps it behind a build-tagged stub and everything else
// (the agent, hosts check) reaches NVML through detect's host facts.
var importedOnlyBy = map[string]string{
	"github.com/NVIDIA/go-nvml": "launch/detect",
}

// TestImportedOnlyBy fails when a package other than the one allowed
// imports go-nvml directly, and when the allowed one no longer does (the
// rule would then check nothing).
func TestImportedOnlyBy(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	importers := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		rel := strings.TrimPrefix(strings.TrimPrefix(fields[0], module), "/")
		for prefix, owner := range importedOnlyBy {
			for _, b := range banned(fields[1:], []string{prefix}) {
				if rel != owner {
					t.Errorf("%s imports %s; only %s may import %s (see docs/architecture.md)", fields[0], b.dep, owner, prefix)
				}
				importers[prefix]++
			}
		}
	}
	for prefix, owner := range importedOnlyBy {
		if importers[prefix] == 0 {
			t.Errorf("nothing imports %s: has %s moved? (build with cgo for its NVML files)", prefix, owner)
		}
	}
}

// violation is a dependency dep that the rule ban forbids.
type violation struct{ dep, ban string }

// banned returns the deps that one of bans names, or is a prefix of.
func banned(deps, bans []string) []violation {
	var out []violation
	for _, d := range deps {
		for _, ban := range bans {
			if d == ban || strings.HasPrefix(d, strings.TrimSuffix(ban, "/")+"/") {
				out = append(out, violation{d, ban})
				break
			}
		}
	}
	return out
}
