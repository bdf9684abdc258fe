package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/spf13/cast"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/gtrain/gtrain/internal/usage"
	"github.com/gtrain/gtrain/internal/userfile"
)

// DefaultConfigFile is read from the working directory when it exists and
// no --config (or GTRAIN_CONFIG) names another.
const DefaultConfigFile = "gtrain.yaml"

// notConfigurable are flags that belong to one invocation: taking them from
// the environment or a file would silently change what every run does, so
// setting them there is an error (GTRAIN_CONFIG is the exception: it names
// the file).
var notConfigurable = map[string]bool{"config": true, "help": true, "dry-run": true}

// applyConfig fills every flag of cmd that was not given on the command line:
// first from a GTRAIN_<FLAG> environment variable (dashes as underscores,
// upper case), then from the config file's key of the flag's name, else the
// flag keeps its default. Command-line flags always win. A fresh viper per
// invocation keeps bindings from leaking between commands.
func applyConfig(cmd *cobra.Command, getenv func(string) string) error {
	v := viper.New()
	v.SetEnvPrefix("GTRAIN")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	if err := readConfigFile(cmd, v, getenv); err != nil {
		return err
	}
	var errs []error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		env := "GTRAIN_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if notConfigurable[f.Name] {
			if f.Name != "config" && getenv(env) != "" {
				errs = append(errs, fmt.Errorf("config: %s is set, but --%s can only be given on the command line: unset it", env, f.Name))
			}
			return
		}
		if f.Changed {
			return
		}
		if val := getenv(env); val != "" {
			if err := setFlag(f, []string{val}); err != nil {
				errs = append(errs, fmt.Errorf("config: %s=%q: %w", env, val, err))
			}
			return
		}
		key := f.Name
		if !v.InConfig(key) {
			// torchrun's spelling: nproc_per_node.
			if key = strings.ReplaceAll(f.Name, "-", "_"); !v.InConfig(key) {
				return
			}
		}
		vals, err := configValues(v.Get(key))
		if err == nil {
			err = setFlag(f, vals)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("config: %s: key %q: %w", v.ConfigFileUsed(), f.Name, err))
		}
	})
	if len(errs) > 0 {
		// Every problem at once, on gtrain's one error line.
		return &usage.Error{Err: errors.New(usage.OneLine(errors.Join(errs...)))}
	}
	return nil
}

// readConfigFile loads --config, else GTRAIN_CONFIG, else ./gtrain.yaml if
// present. A config file that was named explicitly must exist.
func readConfigFile(cmd *cobra.Command, v *viper.Viper, getenv func(string) string) error {
	path, _ := cmd.Flags().GetString("config")
	explicit := path != ""
	if !explicit {
		path = getenv("GTRAIN_CONFIG")
		explicit = path != ""
	}
	if !explicit {
		path = DefaultConfigFile
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
	}
	b, err := userfile.Read(cmd.Context(), path, userfile.ConfigLimit)
	if err != nil {
		return userfile.Prefix(cmd.Context(), "config", err)
	}
	v.SetConfigFile(path) // names the file in errors; ReadConfig reads b
	v.SetConfigType("yaml")
	if err := v.ReadConfig(bytes.NewReader(b)); err != nil {
		return usage.Errorf("config: read %s: %s", path, usage.OneLine(err))
	}
	for _, k := range v.AllKeys() {
		name := strings.ReplaceAll(k, "_", "-")
		if notConfigurable[name] {
			return usage.Errorf("config: %s: key %q: --%s can only be given on the command line", path, k, name)
		}
		if !anyCommandHasFlag(cmd.Root(), name) {
			return usage.Errorf("config: %s: unknown key %q (keys are flag names of gtrain's commands, e.g. nproc-per-node)", path, k)
		}
	}
	return nil
}

// configValues turns a YAML value into flag strings: a list gives one string
// per element (for repeatable flags), anything else one.
func configValues(val any) ([]string, error) {
	if list, ok := val.([]any); ok {
		out := make([]string, len(list))
		for i, x := range list {
			s, err := cast.ToStringE(x)
			if err != nil {
				return nil, err
			}
			out[i] = s
		}
		return out, nil
	}
	s, err := cast.ToStringE(val)
	if err != nil {
		return nil, err
	}
	return []string{s}, nil
}

// setFlag sets f from vals without marking it changed on the command line.
func setFlag(f *pflag.Flag, vals []string) error {
	if len(vals) > 1 && !strings.HasSuffix(f.Value.Type(), "Array") && !strings.HasSuffix(f.Value.Type(), "Slice") {
		return fmt.Errorf("a list, but --%s takes one value", f.Name)
	}
	for _, s := range vals {
		if err := f.Value.Set(s); err != nil {
			// pflag's own message is strconv's; say what the flag takes.
			return fmt.Errorf("--%s takes %s, not %q", f.Name, typeName(f.Value.Type()), s)
		}
	}
	return nil
}

// underscoreToDash lets --nproc_per_node (torchrun's spelling) mean --nproc-per-node.
func underscoreToDash(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
}

// typeName is how a flag's value type reads in an error message.
func typeName(t string) string {
	switch t {
	case "int":
		return "a whole number"
	case "duration":
		return "a duration like 30s or 2m"
	case "bool":
		return "true or false"
	case "format":
		return "text or json"
	}
	return "a " + t
}

// anyCommandHasFlag reports whether some command of the tree has the flag:
// one config file serves every command, each taking the keys it knows.
func anyCommandHasFlag(c *cobra.Command, name string) bool {
	if c.Flags().Lookup(name) != nil || c.PersistentFlags().Lookup(name) != nil {
		return true
	}
	for _, sub := range c.Commands() {
		if anyCommandHasFlag(sub, name) {
			return true
		}
	}
	return false
}
