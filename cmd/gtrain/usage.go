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
	for _, c := range root.Commands() {
		if c.Name() == "help" || c.Name() == "completion" {
			skipConfigTree(c)
		}
	}
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

// noConfig is the annotation of a command whose flags are not taken from
// GTRAIN_* or the config file: gtrain's internal commands (their flags come
// from the launcher), version, help and completion.
const noConfig = "gtrain/no-config"

// skipConfig marks cmd as taking no config (see noConfig).
func skipConfig(cmd *cobra.Command) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[noConfig] = "true"
	return cmd
}

// newGroup is a command that only holds subcommands (`gtrain ckpt`):
// called alone it is a usage error naming them, as an unknown subcommand is.
func newGroup(use, short, long string, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			names := make([]string, 0, len(subs))
			for _, s := range subs {
				names = append(names, s.Name())
			}
			return usage.Errorf("%s: name a subcommand: %s %s (see %s --help)",
				commandName(cmd), cmd.CommandPath(), strings.Join(names, "|"), cmd.CommandPath())
		},
	}
	skipConfig(cmd)
	cmd.AddCommand(subs...)
	return cmd
}

// commandName is cmd's path without the root's name: "ckpt ls".
func commandName(cmd *cobra.Command) string {
	if !cmd.HasParent() {
		return cmd.Name()
	}
	return strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
}

// skipConfigTree marks c and every command under it with skipConfig.
func skipConfigTree(c *cobra.Command) {
	skipConfig(c)
	for _, sub := range c.Commands() {
		skipConfigTree(sub)
	}
}
