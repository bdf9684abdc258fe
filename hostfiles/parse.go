package hostfiles

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/internal/userfile"
)

// ReadFile reads and parses the hostfile at path. The read is bounded
// ([MaxFileSize]), refuses directories and special files and returns as soon
// as ctx ends, even while the file blocks (a FIFO); a file that cannot be
// used is a [*userfile.Error] naming it, its contents' problems
// [*ParseError]s.
func ReadFile(ctx context.Context, path string) ([]Host, error) {
	b, err := userfile.Read(ctx, path, MaxFileSize)
	if err != nil {
		return nil, userfile.Prefix(ctx, "hostfiles", err)
	}
	return Parse(path, bytes.NewReader(b))
}

// Parse reads a hostfile from r; name is used in error messages only.
// Problems with the contents are reported as [*ParseError].
// A file larger than [MaxFileSize], with more than [MaxHosts] hosts or more
// than [MaxFileSlots] slots is refused.
func Parse(name string, r io.Reader) ([]Host, error) {
	return ParseSlots(name, r, nil)
}

// SlotsFunc gives a host whose line has no slot count its slots: gtrain run
// --nproc-per-node gpu|auto counts them on the host, as torchrun does on
// each node. Its error is the line's.
type SlotsFunc func(h Host) (int, error)

// ReadFileSlots is [ReadFile] where a host line without a slot count takes
// slotsFor's instead of being an error; every other rule stays.
func ReadFileSlots(ctx context.Context, path string, slotsFor SlotsFunc) ([]Host, error) {
	b, err := userfile.Read(ctx, path, MaxFileSize)
	if err != nil {
		return nil, userfile.Prefix(ctx, "hostfiles", err)
	}
	return ParseSlots(path, bytes.NewReader(b), slotsFor)
}

// ParseSlots is [Parse] with slotsFor as in [ReadFileSlots]; nil keeps a
// line without a slot count an error.
func ParseSlots(name string, r io.Reader, slotsFor SlotsFunc) ([]Host, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("hostfiles: read %s: %w", name, err)
	}
	if len(data) > MaxFileSize {
		return nil, &ParseError{File: name, Msg: fmt.Sprintf("larger than %d MiB, the limit for a hostfile: is it the right file?", MaxFileSize>>20)}
	}
	text := strings.TrimPrefix(string(data), "\uFEFF")
	var hosts []Host
	seen := make(map[string]Host)
	slots := 0
	for i, line := range strings.Split(text, "\n") {
		h, ok, err := parseLine(line)
		if errors.Is(err, errNoSlots) && slotsFor != nil {
			ok, err = true, slotsOf(&h, slotsFor)
		}
		if err != nil {
			return nil, &ParseError{File: name, Line: i + 1, Msg: err.Error()}
		}
		if !ok {
			continue
		}
		h.Line = i + 1
		key := hostKey(h.Name)
		if first, dup := seen[key]; dup {
			return nil, &ParseError{File: name, Line: h.Line, Msg: duplicateMsg(h, first)}
		}
		seen[key] = h
		hosts = append(hosts, h)
		slots += h.Slots
		if err := checkSize(len(hosts), slots); err != nil {
			return nil, &ParseError{File: name, Line: h.Line, Msg: err.Error()}
		}
	}
	if len(hosts) == 0 {
		return nil, &ParseError{File: name,
			Msg: `no hosts (the file is empty or only comments): add one line per host, like "worker-0 slots=8"`}
	}
	return hosts, nil
}

// checkSize bounds the hosts and slots of one hostfile.
func checkSize(hosts, slots int) error {
	switch {
	case hosts > MaxHosts:
		return fmt.Errorf("more than %d hosts, the most a hostfile may list: split the file", MaxHosts)
	case slots > MaxFileSlots:
		return fmt.Errorf("more than %d slots in all, the most a hostfile may list: split the file", MaxFileSlots)
	}
	return nil
}

func duplicateMsg(h, first Host) string {
	if h.Name == first.Name {
		return fmt.Sprintf("duplicate host %q (first on line %d): remove one of the lines", h.Name, first.Line)
	}
	return fmt.Sprintf("duplicate host %q (first on line %d as %q): remove one of the lines",
		h.Name, first.Line, first.Name)
}

// parseLine parses one line; ok is false for blank and comment lines.
func parseLine(line string) (h Host, ok bool, err error) {
	if i := strings.IndexByte(line, '#'); i >= 0 {
		line = line[:i]
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return Host{}, false, nil
	}
	h, err = parseHost(fields)
	return h, err == nil, err
}

// hostSpec is the first field of a line: [user@]host[:suffix].
type hostSpec struct {
	user, name string
	suffix     string // after "host:", a port or (short form) a slot count
	hasSuffix  bool
}

func parseHost(fields []string) (Host, error) {
	spec, err := parseSpec(fields[0])
	if err != nil {
		return Host{}, err
	}
	kv, err := parseKeys(fields[1:])
	if err != nil {
		return Host{}, err
	}
	h := Host{Name: spec.name, User: spec.user}
	switch {
	case kv.hasSlots:
		h.Slots = kv.slots
		if spec.hasSuffix {
			if h.Port, err = parsePort(spec.suffix); err != nil {
				return Host{}, err
			}
		}
	case spec.hasSuffix && len(fields) == 1:
		if h.Slots, err = parseCount("slot count in "+strconv.Quote(fields[0]), spec.suffix); err != nil {
			return Host{}, err
		}
	case spec.hasSuffix:
		return Host{}, fmt.Errorf("missing slots= for %q (with other fields, host:X is host:port): add slots=N", fields[0])
	default:
		h.MaxSlots = kv.maxSlots
		return h, fmt.Errorf("missing slot count for %q: add slots=N, like %q%w", fields[0], fields[0]+" slots=8", errNoSlots)
	}
	if kv.hasMax {
		if kv.maxSlots < h.Slots {
			return Host{}, fmt.Errorf("max_slots=%d is less than slots=%d: raise max_slots or remove it", kv.maxSlots, h.Slots)
		}
		h.MaxSlots = kv.maxSlots
	}
	return h, nil
}

func parseSpec(field string) (hostSpec, error) {
	var spec hostSpec
	host := field
	if user, rest, ok := strings.Cut(field, "@"); ok {
		if err := checkUser(field, user, rest); err != nil {
			return spec, err
		}
		spec.user, host = user, rest
	}
	var err error
	switch {
	case strings.HasPrefix(host, "["):
		err = spec.bracketed(host)
	case strings.Count(host, ":") >= 2:
		spec.name = host
		err = checkIPv6(host)
	default:
		spec.name, spec.suffix, spec.hasSuffix = strings.Cut(host, ":")
		err = checkHostname(spec.name)
	}
	return spec, err
}

// bracketed parses "[ipv6]" or "[ipv6]:suffix".
func (spec *hostSpec) bracketed(host string) error {
	end := strings.IndexByte(host, ']')
	if end < 0 {
		return fmt.Errorf("missing \"]\" in %q: write IPv6 addresses as [addr] or [addr]:port", host)
	}
	spec.name = host[1:end]
	if err := checkIPv6(spec.name); err != nil {
		return err
	}
	rest := host[end+1:]
	if rest == "" {
		return nil
	}
	if rest[0] != ':' {
		return fmt.Errorf("unexpected %q after \"]\" in %q: write [addr] or [addr]:port", rest, host)
	}
	spec.suffix, spec.hasSuffix = rest[1:], true
	return nil
}

func checkUser(field, user, host string) error {
	switch {
	case user == "":
		return fmt.Errorf("empty user in %q: write user@host, or just host", field)
	case host == "":
		return fmt.Errorf("empty host in %q: write user@host", field)
	case strings.Contains(host, "@"):
		return fmt.Errorf("more than one \"@\" in %q: write user@host", field)
	case !validName(user):
		return fmt.Errorf("invalid user %q: use letters, digits, \".\", \"-\" and \"_\", not starting with \"-\" or \".\"", user)
	}
	return nil
}

func checkHostname(name string) error {
	if name == "" {
		return errors.New(`empty host name: start the line with the host, like "worker-0 slots=8"`)
	}
	if len(name) > 253 || !validName(name) {
		return fmt.Errorf("invalid host name %q: use letters, digits, \".\", \"-\" and \"_\", "+
			"not starting with \"-\" or \".\" (put IPv6 addresses in brackets)", name)
	}
	return nil
}

// validName reports whether s is non-empty, made of [A-Za-z0-9._-] and does
// not start with "-" (which ssh would take as an option) or ".".
func validName(s string) bool {
	if s == "" || s[0] == '-' || s[0] == '.' {
		return false
	}
	for _, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '-' || c == '_'
		if !ok {
			return false
		}
	}
	return true
}

func checkIPv6(s string) error {
	addr, err := netip.ParseAddr(s)
	if err != nil || !addr.Is6() {
		return fmt.Errorf("invalid IPv6 address %q: fix the address, or put a host name without colons", s)
	}
	// The zone must survive Format's brackets and the filter syntax.
	if zone := addr.Zone(); zone != "" && !validName(zone) {
		return fmt.Errorf("invalid IPv6 zone %q in %q: use letters, digits, \".\", \"-\" and \"_\"", zone, s)
	}
	return nil
}

// keyVals holds the key=value fields of a line.
type keyVals struct {
	slots, maxSlots  int
	hasSlots, hasMax bool
}

func parseKeys(fields []string) (keyVals, error) {
	var kv keyVals
	for _, f := range fields {
		key, val, ok := strings.Cut(f, "=")
		if !ok {
			return kv, fmt.Errorf("unexpected field %q: want key=value, like slots=8", f)
		}
		var err error
		switch key {
		case "slots":
			if kv.hasSlots {
				return kv, errors.New("repeated key slots=: keep one")
			}
			kv.slots, err = parseCount("slots=", val)
			kv.hasSlots = true
		case "max_slots", "max-slots":
			if kv.hasMax {
				return kv, errors.New("repeated key max_slots= (or max-slots=): keep one")
			}
			kv.maxSlots, err = parseCount(key+"=", val)
			kv.hasMax = true
		default:
			return kv, fmt.Errorf("unknown key %q: allowed keys are slots, max_slots (or max-slots)", key)
		}
		if err != nil {
			return kv, err
		}
	}
	return kv, nil
}

// parseCount parses a slot count in [1, MaxSlotsPerHost]; what names it in errors.
func parseCount(what, s string) (int, error) {
	n, err := parseDigits(s)
	if err != nil || n < 1 || n > MaxSlotsPerHost {
		return 0, fmt.Errorf("invalid %s %q: want a whole number from 1 to %d", what, s, MaxSlotsPerHost)
	}
	return n, nil
}

func parsePort(s string) (int, error) {
	n, err := parseDigits(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("invalid port %q: want a number from 1 to 65535", s)
	}
	return n, nil
}

// parseDigits parses a non-empty run of ASCII digits; unlike strconv.Atoi it
// refuses signs.
func parseDigits(s string) (int, error) {
	if s == "" {
		return 0, errors.New("empty")
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, errors.New("not a number")
		}
	}
	return strconv.Atoi(s)
}

// errNoSlots marks a line that names a host without its slot count (its
// message is the line's error's; it adds nothing to it).
var errNoSlots = noSlotsError{}

type noSlotsError struct{}

func (noSlotsError) Error() string { return "" }

// slotsOf gives h the slots slotsFor counts, within the bounds of a
// line's slots= and its own max_slots=.
func slotsOf(h *Host, slotsFor SlotsFunc) error {
	n, err := slotsFor(*h)
	switch {
	case err != nil:
		return err
	case n < 1 || n > MaxSlotsPerHost:
		return fmt.Errorf("%q has %d slots by --nproc-per-node: want 1 to %d; add slots=N", h.Name, n, MaxSlotsPerHost)
	case h.MaxSlots != 0 && n > h.MaxSlots:
		return fmt.Errorf("%q has %d slots by --nproc-per-node, more than its max_slots=%d: add slots=N", h.Name, n, h.MaxSlots)
	}
	h.Slots = n
	return nil
}
