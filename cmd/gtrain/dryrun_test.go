package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/launch"
)

func testPlan(t *testing.T, hosts, slots int) *launch.Job {
	t.Helper()
	var nodes []hostfiles.Node
	for h := range hosts {
		n := hostfiles.Node{Host: hostfiles.Host{Name: "w" + strings.Repeat("x", h), Slots: slots}}
		for s := range slots {
			n.SlotIDs = append(n.SlotIDs, s)
		}
		nodes = append(nodes, n)
	}
	p, err := launch.NewJob(launch.JobOptions{Nodes: nodes, FromHostfile: true, Command: []string{"sh", "-c", "echo <&>"},
		Env: []string{"A=1"}, Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrintJobJSON: the plan streamed a rank at a time is the document
// json.Encoder writes for it, byte for byte.
func TestPrintJobJSON(t *testing.T) {
	p := testPlan(t, 3, 2)
	var want bytes.Buffer
	enc := json.NewEncoder(&want)
	enc.SetIndent("", "  ")
	if err := enc.Encode(p); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if err := printJob(context.Background(), &got, p, "json"); err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Errorf("streamed JSON differs:\n%s\nwant:\n%s", got.String(), want.String())
	}
}

// TestPrintJobInterrupted: printing stops with the context's cause.
func TestPrintJobInterrupted(t *testing.T) {
	p := testPlan(t, 2, 2)
	cause := errors.New("interrupted")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	for _, output := range []string{"text", "json"} {
		if err := printJob(ctx, new(bytes.Buffer), p, output); !errors.Is(err, cause) {
			t.Errorf("printJob(%s) after cancel = %v, want the cause", output, err)
		}
	}
}
