package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/internal/usage"
)

// CheckState is the outcome of one check of a host.
type CheckState string

// The outcomes of a check. Skipped is neither good nor bad: the check could
// not run (an earlier one failed) or had nothing to check.
const (
	CheckOK      CheckState = "ok"
	CheckFailed  CheckState = "fail"
	CheckSkipped CheckState = "skipped"
)

// CheckResult is one check of a host. Detail is a short reason when it failed
// or was skipped ("timed out", "changed key"), else an optional note.
type CheckResult struct {
	State  CheckState `json:"state"`
	Detail string     `json:"detail,omitempty"`
}

func passed(detail string) CheckResult  { return CheckResult{CheckOK, detail} }
func failed(detail string) CheckResult  { return CheckResult{CheckFailed, detail} }
func skipped(detail string) CheckResult { return CheckResult{CheckSkipped, detail} }

// HostReport is what HostCheck found out about one host.
type HostReport struct {
	Host          string      `json:"host"`
	Node          int         `json:"node"`
	Local         bool        `json:"local"`          // this machine: checked without SSH
	Addr          string      `json:"addr,omitempty"` // host:port dialled
	User          string      `json:"user,omitempty"`
	Reach         CheckResult `json:"reach"`    // TCP connect
	Auth          CheckResult `json:"auth"`     // SSH login
	HostKey       CheckResult `json:"host_key"` // known_hosts
	Gtrain        CheckResult `json:"gtrain"`
	GtrainPath    string      `json:"gtrain_path,omitempty"`
	GtrainVersion string      `json:"gtrain_version,omitempty"`
	System        CheckResult `json:"system"` // uname -sm and nproc
	OSArch        string      `json:"os_arch,omitempty"`
	CPUs          int         `json:"cpus"`
	GPU           CheckResult `json:"gpu"` // detection (else nvidia-smi -L, on a host whose gtrain predates hosts detect)
	GPUs          int         `json:"gpus"`
	// Facts is the host's hardware as launch/detect found it there: this
	// gtrain's for this machine, `gtrain hosts detect` on the others; nil
	// when that could not run (no gtrain on the host yet).
	Facts      *hostinfo.Host `json:"facts,omitempty"`
	Master     CheckResult    `json:"master"` // this host reaches node 0
	MasterAddr string         `json:"master_addr,omitempty"`
	OK         bool           `json:"ok"`
	Error      string         `json:"error,omitempty"` // every failure in full, "; "-separated
}

// Ready reports whether no check of the host failed.
func (r *HostReport) Ready() bool {
	for _, c := range []CheckResult{r.Reach, r.Auth, r.HostKey, r.Gtrain, r.System, r.GPU, r.Master} {
		if c.State == CheckFailed {
			return false
		}
	}
	return true
}

// HostCheck checks that hosts are ready for a job (`gtrain hosts check`):
// reachable, logged in to with a trusted host key, gtrain there or copyable,
// and node 0 (the master) reachable from every other host. It starts and
// copies nothing; with AcceptNew, a new host key is remembered as in a run.
type HostCheck struct {
	SSH *SSH
	// Version is this gtrain's version: hosts that are this machine run it.
	Version string
	// Getenv reads the Slurm allocation's variables for --hostfile slurm;
	// nil is os.Getenv.
	Getenv func(string) string
	// Launcher is --launcher: how CheckHostfile reaches the hosts, as
	// gtrain run starts its agents (auto: srun on the Slurm allocation's
	// nodes, else SSH; "" is auto).
	Launcher string
	Srun     *Srun // when set, every host but this machine is reached by srun, not SSH (hostcheck_srun.go)
}

// HostsOf returns nodes as a Job numbers them, for commands that need the
// hosts but no job.
func HostsOf(nodes []hostfiles.Node) []Host {
	out := make([]Host, len(nodes))
	for i, n := range nodes {
		out[i] = Host{Name: n.Name, Addr: n.Addr(), User: n.User, Node: i, Slots: n.SlotIDs, Local: IsLocalHost(n.Name)}
	}
	return out
}

// CheckHostfile checks the hosts of the hostfile at path that filter
// selects (Check); path HostfileSlurm is the Slurm allocation's nodes. A
// hostfile that cannot be read or parsed, or a filter that selects
// nothing, is an error before any host is contacted.
func (hc *HostCheck) CheckHostfile(ctx context.Context, path string, filter hostfiles.Filter) ([]HostReport, error) {
	getenv := hc.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	hosts, err := hostfiles.ReadHosts(ctx, path, getenv)
	if err != nil {
		return nil, err
	}
	nodes, err := hostfiles.Select(hosts, filter)
	if err != nil {
		return nil, &usage.Error{Err: err}
	}
	if err := hc.useLauncher(path, getenv); err != nil {
		return nil, err
	}
	reports := hc.Check(ctx, HostsOf(nodes))
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	return reports, nil
}

// CountReady is the number of reports whose host is ready (OK).
func CountReady(reports []HostReport) int {
	n := 0
	for _, r := range reports {
		if r.OK {
			n++
		}
	}
	return n
}

// Check checks every host in parallel, each step bounded by the SSH connect
// timeout, and returns one report per host, in order. hosts[0] is the master.
func (hc *HostCheck) Check(ctx context.Context, hosts []Host) []HostReport {
	probes := make([]*hostProbe, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		probes[i] = &hostProbe{HostReport: HostReport{Host: h.Name, Node: h.Node, Local: h.Local}, host: h}
		wg.Go(func() { hc.probe(ctx, probes[i]) })
	}
	wg.Wait()
	defer func() {
		for _, p := range probes {
			if p.client != nil {
				p.client.Close()
			}
		}
	}()
	hc.checkMaster(ctx, probes)
	out := make([]HostReport, len(probes))
	for i, p := range probes {
		p.OK = p.Ready()
		p.Error = strings.Join(p.errs, "; ")
		out[i] = p.HostReport
	}
	return out
}

// hostProbe is one host being checked.
type hostProbe struct {
	HostReport
	host      Host
	target    sshTarget
	client    *ssh.Client
	sh        shellFunc // nil when the host could not be reached
	errs      []string
	srunLocal net.Addr // srun: this machine's address toward the host; nil when unknown
}

func (p *hostProbe) fail(err error) { p.errs = append(p.errs, err.Error()) }

func (hc *HostCheck) timeout() time.Duration {
	if d := hc.SSH.Config.ConnectTimeout; d > 0 {
		return d
	}
	return 10 * time.Second
}

// probe logs in to the host (or takes this machine as it is) and gathers its
// facts.
func (hc *HostCheck) probe(ctx context.Context, p *hostProbe) {
	if p.host.Local {
		p.Reach, p.Auth, p.HostKey = passed("local"), passed("local"), passed("local")
		p.sh = localShell
		hc.facts(ctx, p)
		return
	}
	if hc.Srun != nil {
		hc.probeSrun(ctx, p)
		return
	}
	s := hc.SSH
	p.target = s.resolveTarget(ctx, p.host, p.host.User, hostPort(p.host))
	p.Addr, p.User = p.target.Addr(), p.target.User
	client, err := s.dial(ctx, p.target)
	if err != nil {
		p.dialFailed(err)
		return
	}
	p.client = client
	p.Reach, p.Auth, p.HostKey = passed(""), passed(""), passed("")
	p.sh = sshShell(client)
	hc.facts(ctx, p)
}

// dialFailed sorts a failed dial into reach, host key and auth. The host key
// is checked before the login, so a refused key leaves auth untried.
func (p *hostProbe) dialFailed(err error) {
	p.fail(err)
	reason := shortReason(err)
	var (
		he *HostError
		hk *HostKeyError
	)
	p.Reach, p.Auth, p.HostKey = passed(""), skipped(""), skipped("")
	switch {
	case errors.As(err, &he) && strings.HasPrefix(he.Op, "connect to"):
		p.Reach = failed(reason) // includes a failed ProxyJump hop
	case errors.As(err, &hk):
		p.HostKey = failed(reason)
	case errors.As(err, &he) && strings.Contains(err.Error(), "unable to authenticate"):
		p.HostKey, p.Auth = passed(""), failed(reason)
	case errors.As(err, &he):
		p.Auth = failed(reason) // the handshake broke off before or during login
	default:
		p.Reach = failed(reason) // e.g. an unreadable known_hosts
	}
	p.Gtrain, p.System, p.GPU, p.Master = skipped(""), skipped(""), skipped(""), skipped("")
}

// facts runs the system, GPU and gtrain checks at once, each in its own
// session.
func (hc *HostCheck) facts(ctx context.Context, p *hostProbe) {
	var wg sync.WaitGroup
	var gt gtrainFound
	errs := make([]error, 3)
	wg.Go(func() { errs[0] = hc.system(ctx, p) })
	wg.Go(func() { errs[1] = hc.gpus(ctx, p) })
	if !p.Local {
		wg.Go(func() { gt, errs[2] = hc.findGtrain(ctx, p) })
	}
	wg.Wait()
	if p.Local {
		p.Gtrain, p.GtrainVersion = passed("this binary"), hc.Version
	} else {
		errs[2] = hc.judgeGtrain(p, gt, errs[2])
		if gt.present && errs[2] == nil {
			if err := hc.remoteDetect(ctx, p, gt.path); err != nil {
				errs[1] = err
			}
		}
	}
	for _, err := range errs {
		if err != nil {
			p.fail(err)
		}
	}
}

// system reads the host's OS, architecture and CPU count.
func (hc *HostCheck) system(ctx context.Context, p *hostProbe) error {
	res, err := hc.bounded(ctx, p.sh, "uname -sm; nproc 2>/dev/null || getconf _NPROCESSORS_ONLN")
	if err == nil && res.code != 0 {
		err = fmt.Errorf("exit status %d: %s", res.code, firstLine(res.stderr))
	}
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if err == nil && len(lines) != 2 {
		err = fmt.Errorf("unexpected output %q", res.stdout)
	}
	if err != nil {
		p.System = failed(shortReason(err))
		return fmt.Errorf("check: uname -sm; nproc on %s: %w", p.Host, err)
	}
	p.OSArch = strings.TrimSpace(lines[0])
	p.CPUs, _ = strconv.Atoi(strings.TrimSpace(lines[1]))
	p.System = passed("")
	return nil
}

// gtrainFound is where gtrain is on a host and what `gtrain version` said.
type gtrainFound struct {
	present bool
	path    string
	version string
}

// findGtrain looks for the gtrain a run would start: --remote-gtrain, else
// the cache entry for this binary that (*SSH).remoteGtrain uses (same path).
func (hc *HostCheck) findGtrain(ctx context.Context, p *hostProbe) (gtrainFound, error) {
	bin := hc.gtrainPath()
	expr := shellQuote(bin)
	if bin == "" {
		_, hash, err := hc.SSH.self()
		if err != nil {
			return gtrainFound{}, fmt.Errorf("find gtrain executable: %w", err)
		}
		expr = cachedGtrain(hash)
	}
	script := `b=` + expr + `; case $b in */*) [ -f "$b" ] && [ -x "$b" ];; *) command -v "$b" >/dev/null 2>&1;; esac || { echo "absent $b"; exit 0; }; ` +
		`echo "found $b"; ` + hc.withTimeout(`"$b" version`)
	res, err := hc.bounded(ctx, p.sh, script)
	if err != nil {
		return gtrainFound{}, err
	}
	first, rest, _ := strings.Cut(res.stdout, "\n")
	state, path, _ := strings.Cut(first, " ")
	found := gtrainFound{present: state == "found", path: path}
	switch {
	case state != "found" && state != "absent":
		return found, fmt.Errorf("unexpected output %q: %s", res.stdout, firstLine(res.stderr))
	case found.present && res.code != 0:
		return found, fmt.Errorf("%s version: exit status %d: %s", path, res.code, firstLine(res.stderr+rest))
	}
	found.version = strings.TrimPrefix(firstLine(rest), "gtrain ")
	return found, nil
}

// judgeGtrain sets the gtrain check: present, absent but copyable (same OS
// and architecture as this binary), or not usable.
func (hc *HostCheck) judgeGtrain(p *hostProbe, gt gtrainFound, err error) error {
	p.GtrainPath, p.GtrainVersion = gt.path, gt.version
	want := unameFor(runtime.GOOS, runtime.GOARCH)
	switch {
	case err != nil:
		p.Gtrain = failed(shortReason(err))
		return fmt.Errorf("check: gtrain on %s: %w", p.Host, err)
	case gt.present:
		p.Gtrain = passed("")
	case hc.Srun != nil:
		p.Gtrain = failed("not found")
		return fmt.Errorf("check: gtrain on %s: %s: not found there: srun starts gtrain from this path on every node (Slurm clusters share a file system): install it at a path every node sees", p.Host, hc.Srun.Exe)
	case hc.SSH.Config.RemoteGtrain != "":
		p.Gtrain = failed("not found")
		return fmt.Errorf("check: gtrain on %s: --remote-gtrain %s: not found there", p.Host, hc.SSH.Config.RemoteGtrain)
	case p.System.State != CheckOK:
		p.Gtrain = skipped("absent, OS unknown")
	case p.OSArch == want:
		p.Gtrain = passed("absent: will be copied on first run")
	default:
		p.Gtrain = failed(p.OSArch + " host")
		return fmt.Errorf("check: gtrain on %s: absent, and host is %q while this gtrain is built for %q: install a matching gtrain there and pass --remote-gtrain", p.Host, p.OSArch, want)
	}
	return nil
}

// checkMaster checks that every other host reaches node 0 where a run's
// ranks would look for it: node 0's address as this machine reached it, on
// its SSH port; or, when node 0 is this machine, the address the first remote
// host sees this machine at, on a port opened for the check (the launcher
// picks MASTER_ADDR the same way).
func (hc *HostCheck) checkMaster(ctx context.Context, probes []*hostProbe) {
	if len(probes) == 0 {
		return
	}
	m := probes[0]
	m.Master = passed("master")
	host, port, stop, err := hc.masterEndpoint(probes)
	defer stop()
	var wg sync.WaitGroup
	for _, p := range probes[1:] {
		switch {
		case p.sh == nil: // not reached: already skipped
		case p.Local && m.Local:
			p.Master = passed("same machine")
		case err != nil:
			p.Master = skipped(err.Error())
		default:
			wg.Go(func() { hc.probeMaster(ctx, p, host, port) })
		}
	}
	wg.Wait()
}

// masterEndpoint is the address and port the other hosts are to reach node 0
// at. When node 0 is this machine, it listens there until stop.
func (hc *HostCheck) masterEndpoint(probes []*hostProbe) (host string, port int, stop func(), err error) {
	m := probes[0]
	if !m.Local && hc.Srun != nil {
		return "", 0, func() {}, errors.New("node 0 is not this machine: srun has no port of it to try")
	}
	if !m.Local {
		host = m.target.HostName
		if m.client != nil {
			host = hostOnly(m.client.RemoteAddr())
		}
		return host, m.target.Port, func() {}, nil
	}
	for _, p := range probes {
		if a := p.localAddr(); !p.Local && a != nil {
			host = hostOnly(a)
			break
		}
	}
	if host == "" {
		return "", 0, func() {}, errors.New("no remote host reached")
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", 0, func() {}, fmt.Errorf("listen on %s: %v", host, err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return host, l.Addr().(*net.TCPAddr).Port, func() { l.Close() }, nil
}

// probeMaster opens a TCP connection from p to host:port, with bash's
// /dev/tcp, else nc.
func (hc *HostCheck) probeMaster(ctx context.Context, p *hostProbe, host string, port int) {
	p.MasterAddr = net.JoinHostPort(host, strconv.Itoa(port))
	script := fmt.Sprintf(`if command -v bash >/dev/null 2>&1; then set -- bash -c 'exec 3<>"/dev/tcp/$0/$1"' %[1]s %[2]d
elif command -v nc >/dev/null 2>&1; then set -- nc -z -w %[3]d %[1]s %[2]d
else echo "no bash or nc to test with" >&2; exit 3; fi
`, shellQuote(host), port, hc.secs()) + hc.withTimeout(`"$@"`)
	res, err := hc.bounded(ctx, p.sh, script)
	switch {
	case err == nil && res.code == 0:
		p.Master = passed("")
		return
	case err == nil && res.code == 3:
		p.Master = skipped("no bash or nc")
		return
	case err == nil:
		err = errors.New(lastLine(strings.TrimSpace(res.stderr)))
	}
	p.Master = failed(shortReason(err))
	p.fail(fmt.Errorf("check: %s reaching the master at %s: %w", p.Host, p.MasterAddr, err))
}

// secs is the timeout in whole seconds, for timeout(1) and nc -w.
func (hc *HostCheck) secs() int {
	return max(1, int((hc.timeout()+time.Second-1)/time.Second))
}

// withTimeout bounds cmd on the host with timeout(1) where it exists, so a
// hung command (nvidia-smi on a broken driver) does not outlive the check.
func (hc *HostCheck) withTimeout(cmd string) string {
	return fmt.Sprintf("if command -v timeout >/dev/null 2>&1; then timeout %d %s; else %s; fi", hc.secs(), cmd, cmd)
}

// bounded runs script with sh within the timeout, plus a little for the
// round trip, so that timeout(1) on the host (exit status 124) reports first.
func (hc *HostCheck) bounded(ctx context.Context, sh shellFunc, script string) (shellResult, error) {
	d := hc.timeout()
	ctx, cancel := context.WithTimeoutCause(ctx, d+2*time.Second, fmt.Errorf("timed out after %v", d))
	defer cancel()
	res, err := sh(ctx, script)
	if err == nil && res.code == 124 {
		err = fmt.Errorf("timed out after %v", d)
	}
	return res, err
}

// shortReason is a failure in a few words, for a table cell; the full error
// goes into HostReport.Error.
func shortReason(err error) string {
	var hk *HostKeyError
	var dns *net.DNSError
	switch {
	case errors.As(err, &hk) && hk.Changed:
		return "changed key"
	case errors.As(err, &hk):
		return "unknown key"
	case errors.As(err, &dns):
		return "name not found"
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	}
	msg := err.Error()
	for _, r := range [][2]string{{"timed out", "timed out"}, {"i/o timeout", "timed out"}, {"connection refused", "refused"},
		{"no route to host", "no route"}, {"network is unreachable", "network unreachable"}, {"unable to authenticate", "denied"}} {
		if strings.Contains(strings.ToLower(msg), r[0]) {
			return r[1]
		}
	}
	if r := []rune(msg); len(r) > 40 {
		return string(r[:39]) + "…"
	}
	return msg
}
