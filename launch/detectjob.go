package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gtrain/gtrain/internal/hostinfo"
	"github.com/gtrain/gtrain/launch/status"
)

// errDetected ends a job of DetectHosts once every agent has reported.
var errDetected = errors.New("launch: detect: every host reported")

// DetectHosts asks the hostfile's hosts what they are the way a job does:
// each host's agent starts (copied there as for a run), detects its host
// and joins; once all have joined they are stopped before any rank starts
// (gtrain plan --detect). It returns what each host reported, in hostfile
// order; notices (an unreachable host) go to stderr.
func (r *Request) DetectHosts(ctx context.Context, stderr io.Writer) ([]hostinfo.Host, error) {
	q := r.detecting()
	job, err := q.Resolve(ctx, Workload{Command: []string{"true"}})
	if err != nil {
		return nil, err
	}
	return q.detectJob(ctx, job, stderr)
}

// detecting is r for a round that only detects: no restart, a short
// grace, a heartbeat a busy host keeps up with.
func (r *Request) detecting() *Request {
	q := *r
	q.MaxRestarts, q.Grace = 0, time.Second
	q.Heartbeat = max(q.Heartbeat, time.Second)
	return &q
}

// detectJob runs job's agents until every one has joined, stops them
// before any rank starts, and returns what each host reported, in the
// job's node order.
func (r *Request) detectJob(ctx context.Context, job *Job, stderr io.Writer) ([]hostinfo.Host, error) {
	var facts []*hostinfo.Host
	q := *r
	q.Plan = func(_ context.Context, w World) (Planned, error) {
		facts = w.Facts
		return Planned{}, errDetected
	}
	err := q.Execute(ctx, job, status.NewLines(io.Discard, stderr, true), nil)
	if !errors.Is(err, errDetected) {
		if err == nil {
			err = errors.New("launch: detect: the hosts ran the job instead of reporting")
		}
		return nil, err
	}
	hosts := make([]hostinfo.Host, len(facts))
	for i, h := range facts {
		if h == nil {
			return nil, fmt.Errorf("launch: detect: %s reported no hardware facts (its gtrain may be older than this one)", job.Hosts[i].Name)
		}
		hosts[i] = *h
		if hosts[i].Name == "" {
			hosts[i].Name = job.Hosts[i].Name
		}
	}
	return hosts, nil
}
