package launch

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gtrain/gtrain/hostfiles"
	"github.com/gtrain/gtrain/launch/proto"
)

// tamper is a local transport that changes node 1's assignment before sending it.
type tamper struct {
	Local
	edit func(*proto.Assignment)
}

func (t *tamper) Start(ctx context.Context, h Host, asg *proto.Assignment) (AgentConn, error) {
	if h.Node == 1 {
		t.edit(asg)
	}
	return t.Local.Start(ctx, h, asg)
}

// twoLocalHosts is a job on two "hosts" that are both this machine.
func twoLocalHosts(t *testing.T) *Job {
	t.Helper()
	t.Setenv("GTRAIN_TEST_AGENT", "1")
	nodes := []hostfiles.Node{
		{Host: hostfiles.Host{Name: "localhost", Slots: 1}, SlotIDs: []int{0}},
		{Host: hostfiles.Host{Name: "127.0.0.1", Slots: 1}, SlotIDs: []int{0}},
	}
	p, err := NewJob(JobOptions{Nodes: nodes, Command: []string{"sh", "-c", `echo "pid=$$"; touch "$OUT/ran.$RANK"`},
		Grace: time.Second, Heartbeat: time.Second, Env: []string{"OUT=" + t.TempDir()}, Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRendezvousRefusals(t *testing.T) {
	tests := []struct {
		name string
		edit func(*proto.Assignment)
		want []string
	}{
		{"wrong secret", func(s *proto.Assignment) { s.Rendezvous.Secret = []byte(strings.Repeat("x", 32)) },
			[]string{"127.0.0.1", "authentication failed", "rendezvous: refused"}},
		{"never joins", func(s *proto.Assignment) { s.Rendezvous = nil },
			[]string{"missing 127.0.0.1"}},
		{"unknown name", func(s *proto.Assignment) { s.Rendezvous.Name = "intruder" },
			[]string{"intruder"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := twoLocalHosts(t)
			rec := &recorder{}
			tr := &tamper{Local: Local{Exe: os.Args[0]}, edit: tt.edit}
			err := Run(t.Context(), p, Runtime{Transport: tr, View: rec, JoinTimeout: 3 * time.Second})
			if err == nil {
				t.Fatal("Run succeeded, want a refusal")
			}
			var notices []string
			for _, ev := range rec.ofType(proto.EventNotice) {
				notices = append(notices, ev.Message)
			}
			all := err.Error() + "\n" + strings.Join(notices, "\n")
			for _, w := range tt.want {
				if !strings.Contains(all, w) {
					t.Errorf("error and notices do not say %q:\n%s", w, all)
				}
			}
			if n := len(rec.ofType(proto.EventRankStarted)); n != 0 {
				t.Errorf("%d ranks started although the round never completed", n)
			}
			var lost *AgentLostError
			if !errors.As(err, &lost) && !strings.Contains(err.Error(), "rendezvous") {
				t.Errorf("error %T %v, want an agent lost or a rendezvous error", err, err)
			}
		})
	}
}

func TestRendezvousAddr(t *testing.T) {
	tests := []struct {
		host, sshConn, want string
	}{
		{"", "10.1.2.3 51234 10.1.2.9 22", "10.1.2.3:7000"},
		{"", "", "127.0.0.1:7000"},
		{"launcher.example", "10.1.2.3 51234 10.1.2.9 22", "launcher.example:7000"},
		{"", "fe80::1 51234 fe80::2 22", "[fe80::1]:7000"},
	}
	for _, tt := range tests {
		if got := rendezvousAddr(&proto.Rendezvous{Host: tt.host, Port: 7000}, tt.sshConn); got != tt.want {
			t.Errorf("rendezvousAddr(%q, %q) = %q, want %q", tt.host, tt.sshConn, got, tt.want)
		}
	}
}
