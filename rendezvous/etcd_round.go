package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The round in etcd: the launcher writes the expected node names (Expect);
// each node writes its member key under its own lease and watches the
// members' prefix, in revision order, until every name is there.

func (c *EtcdClient) nodesKey() string             { return c.cfg.Prefix + "/round/nodes" }
func (c *EtcdClient) membersKey() string           { return c.cfg.Prefix + "/round/member/" }
func (c *EtcdClient) memberKey(name string) string { return c.membersKey() + name }

// Expect makes the round expect nodes, in rank order. Another job's round
// under the same prefix (the same run id) is refused, not overwritten.
func (c *EtcdClient) Expect(ctx context.Context, nodes []string) error {
	k := c.nodesKey()
	raw, err := json.Marshal(nodes)
	if err != nil {
		return c.errf(k, "expect", err)
	}
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, c.sign(k, raw))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return c.errf(k, "expect", ctxErr(ctx, err))
	}
	if resp.Succeeded {
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 1 {
		if v, err := c.open(k, kvs[0].Value); err == nil && string(v) == string(raw) {
			return nil // this job said so already
		}
	}
	return c.errf(k, "", fmt.Errorf("run id in use by another job: choose another --rdzv-id, or remove the old keys with etcdctl del --prefix %s/", c.cfg.Prefix))
}

// expected waits for the node names Expect wrote, and returns them and the
// revision that wrote them: the round began there.
func (c *EtcdClient) expected(ctx context.Context) ([]string, int64, error) {
	k := c.nodesKey()
	for {
		v, mod, rev, err := c.read(ctx, k, "round")
		if err == nil && mod == 0 {
			if _, _, err = c.waitPut(ctx, k, rev+1); err == nil {
				continue // written (or the watch compacted): read it
			}
		}
		if err != nil {
			return nil, 0, err
		}
		var nodes []string
		if err := json.Unmarshal(v, &nodes); err != nil {
			return nil, 0, c.errf(k, "round", fmt.Errorf("malformed node list: %w", err))
		}
		return nodes, mod, nil
	}
}

// Join joins the round as node name with facts, under a lease of the
// configured TTL that this client keeps alive until Close. It returns once
// every expected node joined; if ctx ends first the node leaves again.
func (c *EtcdClient) Join(ctx context.Context, name string, facts any) (*Round, error) {
	raw, err := json.Marshal(facts)
	if err == nil {
		err = checkName(name)
	}
	if err == nil {
		err = checkFacts(raw)
	}
	if err != nil {
		return nil, fmt.Errorf("rendezvous: etcd %s: join %s: %w", c.where, name, err)
	}
	nodes, since, err := c.expected(ctx)
	if err != nil {
		return nil, err
	}
	rank := slices.Index(nodes, name)
	if rank < 0 {
		return nil, c.errf(c.nodesKey(), "join", errorf(codeUnknown, "unknown node %q: this job expects %s", clip(name), listNames(nodes, 8)))
	}
	if err := c.addMember(ctx, Member{Rank: rank, Name: name, Addr: c.local.(*net.TCPAddr).IP.String(), Facts: raw}); err != nil {
		return nil, err
	}
	members, rev, err := c.waitMembers(ctx, nodes, since)
	if err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		c.cli.Delete(dctx, c.memberKey(name)) // leave, so a restarted agent can join
		cancel()
		return nil, err
	}
	c.mu.Lock()
	c.roundRev = rev
	c.mu.Unlock()
	return &Round{Rank: rank, Members: members}, nil
}

// addMember writes m's key under this client's lease, unless the name
// joined already.
func (c *EtcdClient) addMember(ctx context.Context, m Member) error {
	k := c.memberKey(m.Name)
	lease, err := c.grant(ctx)
	if err != nil {
		return c.errf(k, "join", err)
	}
	raw, _ := json.Marshal(m)
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, c.sign(k, raw), clientv3.WithLease(lease))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return c.errf(k, "join", ctxErr(ctx, err))
	}
	if resp.Succeeded {
		return nil
	}
	from := "?"
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		if prev, err := c.member(k, kvs[0].Value); err == nil {
			from = prev.Addr
		}
	}
	return c.errf(k, "join", errorf(codeDuplicate, "node %s already joined (from %s); the first join stays", m.Name, from))
}

// grant makes this client's lease and keeps it alive until Close.
func (c *EtcdClient) grant(ctx context.Context) (clientv3.LeaseID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lease != 0 {
		return c.lease, nil
	}
	g, err := c.cli.Grant(ctx, int64((c.cfg.TTL+time.Second-1)/time.Second))
	if err != nil {
		return 0, fmt.Errorf("lease: %w", ctxErr(ctx, err))
	}
	ka, err := c.cli.KeepAlive(c.life, g.ID)
	if err != nil {
		return 0, fmt.Errorf("lease keepalive: %w", err)
	}
	c.lease, c.leaseDone = g.ID, make(chan struct{})
	go func(done chan struct{}) {
		for range ka {
		}
		close(done)
	}(c.leaseDone)
	return c.lease, nil
}

// member decodes a member key's stored value.
func (c *EtcdClient) member(k string, stored []byte) (Member, error) {
	var m Member
	v, err := c.open(k, stored)
	if err == nil {
		err = json.Unmarshal(v, &m)
	}
	return m, err
}

// WaitRound waits until every expected node joined and returns them in
// rank order; if ctx ends first, a *RoundError names the missing nodes.
func (c *EtcdClient) WaitRound(ctx context.Context) ([]Member, error) {
	nodes, since, err := c.expected(ctx)
	if err != nil {
		return nil, err
	}
	members, rev, err := c.waitMembers(ctx, nodes, since)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.roundRev = rev
	c.mu.Unlock()
	return members, nil
}

// waitMembers reads the members' prefix as it was at revision since (the
// round's start) and watches it from the revision after, in order, until
// every node is in; it returns them and the revision at which the last one
// came. Reading from the round's start, not now, matters: a node leaves
// (its agent closes its client) as soon as it saw the round close, and a
// node or launcher that looks later must still see the moment it closed.
func (c *EtcdClient) waitMembers(ctx context.Context, nodes []string, since int64) ([]Member, int64, error) {
	start := time.Now()
	have := map[string]Member{}
	p := c.membersKey()
	for {
		resp, err := c.cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithLimit(int64(len(nodes))+1), clientv3.WithRev(since))
		if errors.Is(err, rpctypes.ErrCompacted) && since != 0 {
			since = 0 // that history is gone (etcd compacted it): read now
			continue
		}
		if err != nil {
			return nil, 0, c.roundError(ctx, nodes, have, start, c.errf(p, "round", ctxErr(ctx, err)))
		}
		clear(have)
		for _, kv := range resp.Kvs {
			if err := c.putMember(have, nodes, kv.Key, kv.Value); err != nil {
				return nil, 0, err
			}
		}
		rev := resp.Header.Revision
		if since != 0 {
			rev = since // the read was of then: watch from then on
		}
		if len(have) == len(nodes) {
			return inRankOrder(nodes, have), rev, nil
		}
		rev, done, err := c.watchMembers(ctx, nodes, have, rev+1)
		if err != nil {
			return nil, 0, c.roundError(ctx, nodes, have, start, err)
		}
		if done {
			return inRankOrder(nodes, have), rev, nil
		}
		since = 0 // the watch was compacted: read now
	}
}

// watchMembers applies the members' events from rev in order; done when
// every node is in; false, nil when the watch must start over.
func (c *EtcdClient) watchMembers(ctx context.Context, nodes []string, have map[string]Member, rev int64) (int64, bool, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range c.cli.Watch(wctx, c.membersKey(), clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if wr.Err() != nil {
			return 0, false, nil
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				delete(have, strings.TrimPrefix(string(ev.Kv.Key), c.membersKey()))
				continue
			}
			if err := c.putMember(have, nodes, ev.Kv.Key, ev.Kv.Value); err != nil {
				return 0, false, err
			}
			if len(have) == len(nodes) {
				return ev.Kv.ModRevision, true, nil
			}
		}
	}
	return 0, false, c.errf(c.membersKey(), "round", c.ended(ctx))
}

// putMember checks a member key and records it; one not expected (another
// job's round signed with this secret cannot be) is an error.
func (c *EtcdClient) putMember(have map[string]Member, nodes []string, key, value []byte) error {
	m, err := c.member(string(key), value)
	if err != nil {
		return err
	}
	if !slices.Contains(nodes, m.Name) || c.memberKey(m.Name) != string(key) {
		return c.errf(string(key), "round", fmt.Errorf("member %q is not one of this job's nodes: %w", clip(m.Name), ErrBadRequest))
	}
	have[m.Name] = m
	return nil
}

func inRankOrder(nodes []string, have map[string]Member) []Member {
	out := make([]Member, len(nodes))
	for i, n := range nodes {
		out[i] = have[n]
		out[i].Rank = i
	}
	return out
}

// roundError is a *RoundError naming the missing nodes when ctx ended,
// else err.
func (c *EtcdClient) roundError(ctx context.Context, nodes []string, have map[string]Member, start time.Time, err error) error {
	if ctx.Err() == nil {
		return err
	}
	var missing []string
	for _, n := range nodes {
		if _, ok := have[n]; !ok {
			missing = append(missing, n)
		}
	}
	return &RoundError{Missing: missing, After: time.Since(start), Err: context.Cause(ctx)}
}

// Watch blocks until a member of the closed round is lost (its lease ended:
// a *LostError naming it), this node's own lease ends, or ctx ends. Call it
// after Join or WaitRound.
func (c *EtcdClient) Watch(ctx context.Context) error {
	c.mu.Lock()
	rev, leaseDone := c.roundRev, c.leaseDone
	c.mu.Unlock()
	if rev == 0 {
		return fmt.Errorf("rendezvous: etcd %s: watch: the round has not closed: call Join or WaitRound first", c.where)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := c.cli.Watch(wctx, c.membersKey(), clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				return c.errf(c.membersKey(), "watch", c.ended(ctx))
			}
			if err := wr.Err(); err != nil {
				return c.errf(c.membersKey(), "watch", err)
			}
			for _, ev := range wr.Events {
				name := strings.TrimPrefix(string(ev.Kv.Key), c.membersKey())
				return &LostError{Endpoint: c.where, Node: name, Reason: fmt.Sprintf("its lease ended (the node stopped, or heard nothing from etcd for %v)", c.cfg.TTL)}
			}
		case <-leaseDone: // nil before a Join: never
			if c.life.Err() != nil {
				return c.errf(c.membersKey(), "watch", fmt.Errorf("client %w", ErrClosed))
			}
			return c.errf(c.membersKey(), "watch", errLeaseLost)
		}
	}
}
