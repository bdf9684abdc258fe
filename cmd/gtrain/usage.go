package main

import (
	"fmt"
	"strings"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/spf13/cobra"
)

// typeUsageErrors makes every argument error of the command tree under root
// a *usage.Error at its source, so that ExitCode needs no matching of
// cobra's message texts: each command's Args validator is wrapped, and root
// itself validates its arguments (an unknown command). Flag errors are typed
// by root's FlagErrorFunc. Call it once the tree is complete.
func typeUsageErrors(root *cobra.Command) {
	// cobra adds these two when it executes; add them now so that they are
	// wrapped too (it does not add them twice).
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	root.SuggestionsMinimumDistance = 2 // cobra's default, which SuggestionsFor does not apply
	if root.Args == nil && root.Run == nil && root.RunE == nil {
		// cobra checks a root without Args for unknown commands in Find,
		// with an untyped error; a runnable root with Args checks them here.
		root.Args = unknownCommand
		root.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	wrapArgs(root)
}

// wrapArgs wraps the Args validator of c and of every command under it.
func wrapArgs(c *cobra.Command) {
	if validate := c.Args; validate != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := validate(cmd, args); err != nil {
				return &usage.Error{Err: argsError(cmd, args, err)}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		wrapArgs(sub)
	}
}

// unknownCommand is the Args of a command that only has subcommands.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf(": did you mean %q?", s[0])
	}
	return fmt.Errorf("%s (see %s --help)", msg, cmd.CommandPath())
}

// argsError says what is wrong with a command's arguments, in one line: the
// argument that is missing, by its name in the command's usage, or cobra's
// own message otherwise.
func argsError(cmd *cobra.Command, args []string, err error) error {
	name := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
	want := positionals(cmd.Use)
	switch {
	case cmd.HasSubCommands():
		return err // an unknown command
	case len(args) < len(want):
		return fmt.Errorf("%s: missing %s: usage: %s", name, want[len(args)], cmd.UseLine())
	case len(args) > len(want):
		return fmt.Errorf("%s: unexpected argument %q: usage: %s", name, args[len(want)], cmd.UseLine())
	}
	return fmt.Errorf("%s: %w: usage: %s", name, err, cmd.UseLine())
}

// positionals are the required arguments named in a Use line such as
// "resume [flags] DIR" or "check --hostfile FILE [flags]": upper-case words,
// not optional ([...]) and not a flag's value.
func positionals(use string) []string {
	var out []string
	fields := strings.Fields(use)
	for i := 1; i < len(fields); i++ {
		f := fields[i]
		switch {
		case strings.HasPrefix(f, "-"):
			i++ // the flag's value
		case strings.HasPrefix(f, "["):
		case f == strings.ToUpper(f):
			out = append(out, strings.TrimSuffix(f, "..."))
		}
	}
	return out
}
