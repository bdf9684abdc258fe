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
type outputValue struct{ p *string }

func (v outputValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v outputValue) Set(s string) error {
	if s != outputText && s != outputJSON {
		return fmt.Errorf("want %s or %s", outputText, outputJSON)
	}
	*v.p = s
	return nil
}

func (outputValue) Type() string { return "format" }

// addOutputFlag adds --output/-o to f, stored in p (default text); what
// describes what json prints.
func addOutputFlag(f *pflag.FlagSet, p *string, what string) {
	*p = outputText
	f.VarP(outputValue{p}, "output", "o", "text, or json: "+what)
}

// writeJSON writes v to w as one indented JSON document: the one encoder of
// every command's --output json.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
