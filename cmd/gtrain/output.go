package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

// Output formats of --output (-o): every command that prints a result takes
// the same flag with the same two values.
const (
	outputText = "text"
	outputJSON = "json"
)

// outputValue is --output's value: text or json, checked when the flag is
// set (on the command line, from GTRAIN_OUTPUT or from the config file), so
// no command checks it again.
type outputValue struct {
	p    *string
	hint string // said after the refusal of a value that is not a format
}

func (v outputValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v outputValue) Set(s string) error {
	if s != outputText && s != outputJSON {
		return fmt.Errorf("want %s or %s%s", outputText, outputJSON, v.hint)
	}
	*v.p = s
	return nil
}

func (outputValue) Type() string { return "format" }

// addOutputFlag adds --output/-o to f, stored in p (default text); what
// describes what json prints. Add it after a command's --out, if it has
// one: -o then reminds who meant the file (-o FILE elsewhere) of --out.
func addOutputFlag(f *pflag.FlagSet, p *string, what string) {
	*p = outputText
	v := outputValue{p: p}
	if f.Lookup("out") != nil {
		v.hint = " (-o is --output; name what to write with --out)"
	}
	f.VarP(v, "output", "o", "text, or json: "+what)
}

// writeJSON writes v to w as one indented JSON document: the one encoder of
// every command's --output json.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
