package main

import (
	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/launch"
)

// NewCmdAgent is the hidden `gtrain agent`: the node agent the launcher
// starts on every host. It reads its job spec on stdin and writes events on
// stdout (see launch/proto).
func NewCmdAgent(ios *IOStreams) *cobra.Command {
	return &cobra.Command{
		Use:    "agent",
		Short:  "Node agent started by gtrain run (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return launch.RunAgent(cmd.Context(), ios.In, ios.Out, buildVersion())
		},
	}
}
