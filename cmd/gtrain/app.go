package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/launch"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = ""

// IOStreams are the standard streams a command uses, injectable for tests.
type IOStreams struct {
	In       io.Reader
	Out, Err io.Writer
	// ErrTTY is true when Err is a terminal that can show a live table.
	ErrTTY bool
	Getenv func(string) string
}

// Stdio returns the process's own streams.
func Stdio() *IOStreams {
	return &IOStreams{
		In: os.Stdin, Out: os.Stdout, Err: os.Stderr,
		ErrTTY: term.IsTerminal(int(os.Stderr.Fd())) && os.Getenv("TERM") != "dumb",
		Getenv: os.Getenv,
	}
}

// signals carries gtrain's own interrupts to the commands: the first SIGINT,
// SIGTERM or SIGUSR1 cancels ctx with an *launch.InterruptedError as its
// cause (the launcher forwards SIGTERM and SIGUSR1 to the ranks as a
// preemption); a second one closes abort (stop waiting for a graceful
// teardown). A command that saves its state on preemption (the worker)
// calls catchPreemption first: then the first SIGTERM or SIGUSR1 closes
// preempt instead, more of them change nothing, and only a SIGINT
// cancels ctx.
type signals struct {
	abort   <-chan struct{}
	preempt chan struct{}
	catch   atomic.Bool
	// preemptedBy is the signal that closed preempt.
	preemptedBy atomic.Value
}

// newSignals returns signals whose channels nothing has closed yet.
func newSignals(abort <-chan struct{}) *signals {
	return &signals{abort: abort, preempt: make(chan struct{})}
}

// catchPreemption makes the first SIGTERM or SIGUSR1 close the returned
// channel rather than cancel the command's context.
func (s *signals) catchPreemption() <-chan struct{} {
	s.catch.Store(true)
	return s.preempt
}

// preemptSignal is the signal that closed preempt, or nil.
func (s *signals) preemptSignal() os.Signal {
	sig, _ := s.preemptedBy.Load().(os.Signal)
	return sig
}

// relay turns the process's signals into ctx's cancellation, preempt and
// abort, in that order of escalation.
func (s *signals) relay(sigc <-chan os.Signal, cancel context.CancelCauseFunc, abort chan<- struct{}) {
	preempted, cancelled := false, false
	for sig := range sigc {
		switch {
		case preempted && (sig == syscall.SIGTERM || sig == syscall.SIGUSR1):
			// The preemption again, not a second interrupt of a worker
			// saving its state: a scheduler signals every process of a
			// job step (Slurm's scancel --signal, its preemption's
			// SIGTERM), the agent forwards what it got, and the launcher
			// stops the ranks too. SIGINT still interrupts the save.
		case !preempted && !cancelled && s.catch.Load() && (sig == syscall.SIGTERM || sig == syscall.SIGUSR1):
			preempted = true
			s.preemptedBy.Store(sig)
			close(s.preempt)
		case !cancelled:
			cancelled = true
			cancel(&launch.InterruptedError{Signal: sig})
		default:
			close(abort)
			return
		}
	}
}

// Main runs gtrain with args and returns its exit code.
func Main(args []string, ios *IOStreams) int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	abort := make(chan struct{})
	sigc := make(chan os.Signal, 2)
	// SIGUSR1 is Slurm's warning before preemption (--signal=USR1@…).
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGUSR1)
	// Writes to a closed stdout return EPIPE instead of killing gtrain, so the
	// agent can still tear its ranks down when the launcher is gone.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	defer signal.Stop(sigc)
	sig := newSignals(abort)
	go sig.relay(sigc, cancel, abort)
	root := NewCmdRoot(ios, sig)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err != nil {
		printError(ios.Err, err)
	}
	return ExitCode(err)
}

// printError prints err once, as gtrain's one-line error.
func printError(w io.Writer, err error) {
	var silent *silentError
	if errors.As(err, &silent) {
		return
	}
	fmt.Fprintf(w, "gtrain: %v\n", err)
}

// silentError carries an exit code for an error that was already reported.
type silentError struct{ err error }

func (e *silentError) Error() string { return e.err.Error() }
func (e *silentError) Unwrap() error { return e.err }

// NewCmdRoot builds the command tree.
func NewCmdRoot(ios *IOStreams, sig *signals) *cobra.Command {
	root := &cobra.Command{
		Use:   "gtrain",
		Short: "Launch distributed training jobs on one or many GPU hosts",
		Long: `gtrain launches one rank per GPU slot on every host of a hostfile (or on
this machine), gives each rank the torchrun environment, streams per-rank
output and status, and tears the whole job down when any rank fails.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Version:       buildVersion(),
	}
	root.SetIn(ios.In)
	root.SetOut(ios.Out)
	root.SetErr(ios.Err)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usage.Error{Err: fmt.Errorf("%s: %w", commandName(cmd), err)}
	})
	root.PersistentFlags().String("config", "", "config file (default ./gtrain.yaml if present; env GTRAIN_CONFIG)")
	// One precedence for every command's flags, applied before any runs:
	// command line > GTRAIN_<FLAG> > config file > default (config.go).
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if cmd.Annotations[noConfig] != "" {
			return nil
		}
		return applyConfig(cmd, ios.Getenv)
	}
	root.AddCommand(
		NewCmdRun(ios, sig, nil),
		skipConfig(NewCmdAgent(ios)),
		NewCmdHosts(ios, nil),
		NewCmdBench(ios, sig),
		NewCmdCkpt(ios),
		NewCmdData(ios),
		NewCmdGenerate(ios),
		NewCmdPlan(ios),
		NewCmdResume(ios, sig),
		NewCmdRuns(ios),
		skipConfig(NewCmdWorker(ios, sig)),
		skipConfig(NewCmdVersion(ios)),
	)
	skipConfig(root) // alone, root prints its help
	typeUsageErrors(root)
	return root
}

// buildVersion is the version stamped at build time, else the module version.
func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// NewCmdVersion prints gtrain's version.
func NewCmdVersion(ios *IOStreams) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print gtrain's version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintf(ios.Out, "gtrain %s\n", buildVersion())
			return err
		},
	}
}
