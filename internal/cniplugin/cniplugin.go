// Package cniplugin is the plugin side of the CNI protocol for the ipledger IPAM
// plugin: the CNI_* environment, the verbs, version negotiation, and the error and
// result JSON a runtime reads.
//
// Why not the CNI library's skel, as every other plugin does: its packages' init
// (a regexp, the unicode tables it pulls in, the result types of every spec version)
// and the pages of a binary twice the size cost about 0.4 ms of every exec, a third of
// a no-op Go binary's whole start (docs/call-breakdown.md; `make bench`). The IPAM
// plugin is exec'd for every pod's ADD and DEL and does little else, so that cost was
// its largest share above the floor. This package follows skel's dispatch rule for
// rule (which variables each verb requires and how they are validated, how the
// configuration's cniVersion is reconciled, the error codes and messages, the exit
// status), and its tests hold it to that: they run the library's skel and this
// dispatcher as real processes on the same environments and inputs and compare what
// each writes and returns (TestDispatchMatchesSkel), compare the validators and the
// version comparison with the library's (fuzzed), compare every result encoding with
// the library's, and run the plugin through libcni in every version it supports
// (internal/ipam). The library stays the reference; only the installed binary leaves
// it out.
package cniplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/ipledger/ipledger/internal/jsonlite"
)

// Args are one call's inputs, as the runtime gave them.
type Args struct {
	ContainerID   string
	Netns         string
	IfName        string
	Args          string // CNI_ARGS
	Path          string
	NetnsOverride string
	StdinData     []byte
}

// Funcs are the plugin's verbs. A verb returns nil on success (having written its
// result to stdout, for ADD), an *Error for a failure with a CNI code, or any other
// error, which the runtime sees as code 999. A nil verb succeeds without doing
// anything.
type Funcs struct {
	Add, Del, Check, GC, Status func(*Args) error
}

// Env is the process edge: the environment, stdin and the output streams.
type Env struct {
	Getenv         func(string) string
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// OS is the process's own environment and streams.
func OS() Env {
	return Env{Getenv: os.Getenv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
}

// Main dispatches one CNI call and returns the process's exit status: 0 on success,
// 1 after writing an error to stdout. versions are the spec versions the plugin
// supports, oldest first; about is printed on stderr when the binary is run by hand
// (no CNI_COMMAND).
func Main(env Env, funcs Funcs, versions []string, about string) int {
	e := dispatch(env, funcs, versions, about)
	if e == nil {
		return 0
	}
	if _, err := env.Stdout.Write(e.JSON()); err != nil {
		fmt.Fprintf(env.Stderr, "writing the error JSON to stdout: %v (the error: %v)\n", err, e)
	}
	return 1
}

// required lists, for each variable, the verbs that need it; CNI_COMMAND is needed by
// every call. The order is the order in which they are read and reported.
var envVars = []struct {
	name     string
	required []string // the verbs that need it
	validate func(string) *Error
}{
	{"CNI_COMMAND", []string{"ADD", "CHECK", "DEL", "GC", "STATUS"}, nil},
	{"CNI_CONTAINERID", []string{"ADD", "CHECK", "DEL"}, ValidateContainerID},
	{"CNI_NETNS", []string{"ADD", "CHECK"}, nil},
	{"CNI_IFNAME", []string{"ADD", "CHECK", "DEL"}, ValidateInterfaceName},
	{"CNI_ARGS", nil, nil},
	{"CNI_PATH", []string{"ADD", "CHECK", "DEL", "GC", "STATUS"}, nil},
	{"CNI_NETNS_OVERRIDE", nil, nil},
}

func dispatch(env Env, funcs Funcs, versions []string, about string) *Error {
	cmd := env.Getenv("CNI_COMMAND")
	vals := make([]string, len(envVars))
	var missing []string
	for i, v := range envVars {
		vals[i] = env.Getenv(v.name)
		need := slices.Contains(v.required, cmd)
		switch {
		case vals[i] == "":
			if need || v.name == "CNI_COMMAND" {
				missing = append(missing, v.name)
			}
		case need && v.validate != nil:
			if err := v.validate(vals[i]); err != nil {
				return err
			}
		}
	}
	if len(missing) > 0 {
		if cmd == "" && about != "" {
			fmt.Fprintln(env.Stderr, about)
			fmt.Fprintf(env.Stderr, "CNI protocol versions supported: %s\n", strings.Join(versions, ", "))
			return nil
		}
		return NewError(ErrInvalidEnvironmentVariables, fmt.Sprintf("required env variables [%s] missing", strings.Join(missing, ",")), "")
	}
	if cmd == "VERSION" {
		if _, err := env.Stdout.Write(versionJSON(versions)); err != nil {
			return NewError(ErrIOFailure, err.Error(), "")
		}
		return nil
	}
	stdin, err := io.ReadAll(env.Stdin)
	if err != nil {
		return NewError(ErrIOFailure, fmt.Sprintf("error reading from stdin: %v", err), "")
	}
	conf := readConfig(stdin)
	if e := conf.validate(); e != nil {
		return e
	}
	args := &Args{ContainerID: vals[1], Netns: vals[2], IfName: vals[3], Args: vals[4], Path: vals[5], NetnsOverride: vals[6], StdinData: stdin}
	switch cmd {
	case "ADD":
		return call(funcs.Add, args, conf, versions)
	case "DEL":
		return call(funcs.Del, args, conf, versions)
	case "CHECK":
		return callSince("CHECK", "0.4.0", funcs.Check, args, conf, versions)
	case "GC":
		return callSince("GC", "1.1.0", funcs.GC, args, conf, versions)
	case "STATUS":
		return callSince("STATUS", "1.1.0", funcs.Status, args, conf, versions)
	}
	return NewError(ErrInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND: %v", cmd), "")
}

// call reconciles the configuration's version with the plugin's and runs the verb.
func call(verb func(*Args) error, args *Args, conf config, versions []string) *Error {
	v, err := conf.cniVersion()
	if err != nil {
		return NewError(ErrDecodingFailure, err.Error(), "")
	}
	supported := false
	for _, s := range versions {
		supported = supported || s == v
	}
	if !supported {
		return NewError(ErrIncompatibleCNIVersion, "incompatible CNI versions", fmt.Sprintf("config is %q, plugin supports %q", v, versions))
	}
	if verb == nil {
		return nil
	}
	if err := verb(args); err != nil {
		if e, ok := err.(*Error); ok && e != nil {
			return e
		}
		return NewError(ErrInternal, err.Error(), "")
	}
	return nil
}

// callSince runs a verb that exists since spec version since.
func callSince(name, since string, verb func(*Args) error, args *Args, conf config, versions []string) *Error {
	v, err := conf.cniVersion()
	if err != nil {
		return NewError(ErrDecodingFailure, err.Error(), "")
	}
	ok, err := AtLeast(v, since)
	if err != nil {
		return NewError(ErrDecodingFailure, err.Error(), "")
	}
	if !ok {
		return NewError(ErrIncompatibleCNIVersion, fmt.Sprintf("config version does not allow %s", name), "")
	}
	for _, pv := range versions {
		ok, err := AtLeast(pv, v)
		if err != nil {
			return NewError(ErrDecodingFailure, err.Error(), "")
		}
		if ok {
			return call(verb, args, conf, versions)
		}
	}
	return NewError(ErrIncompatibleCNIVersion, fmt.Sprintf("plugin version does not allow %s", name), "")
}

// config is what the dispatcher reads of the network configuration: its name and
// cniVersion, found in one pass for the common shape.
type config struct {
	stdin         []byte
	name, version string
	fast          bool // name and version were read by hand; else encoding/json decides
}

func readConfig(stdin []byte) config {
	c := config{stdin: stdin}
	c.name, c.version, c.fast = topStrings(stdin)
	return c
}

// validate checks that the configuration is a JSON object naming a valid network.
func (c config) validate() *Error {
	name := c.name
	if !c.fast { // not the common shape: let encoding/json decide and word the error
		var conf struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(c.stdin, &conf); err != nil {
			return NewError(ErrDecodingFailure, fmt.Sprintf("error unmarshall network config: %v", err), "")
		}
		name = conf.Name
	}
	if name == "" {
		return NewError(ErrInvalidNetworkConfig, "missing network name", "")
	}
	return ValidateNetworkName(name)
}

// cniVersion is the configuration's cniVersion; "0.1.0" when it has none.
func (c config) cniVersion() (string, error) {
	if c.fast {
		if c.version == "" {
			return "0.1.0", nil
		}
		return c.version, nil
	}
	return ConfigVersion(c.stdin)
}

// ConfigVersion is the configuration's cniVersion; "0.1.0" when it has none.
func ConfigVersion(stdin []byte) (string, error) {
	if _, v, ok := topStrings(stdin); ok {
		if v == "" {
			return "0.1.0", nil
		}
		return v, nil
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return "", fmt.Errorf("decoding version from network config: %w", err)
	}
	if conf.CNIVersion == "" {
		return "0.1.0", nil
	}
	return conf.CNIVersion, nil
}

// topStrings reads the string members "name" and "cniVersion" of the JSON object
// stdin without reflection ("" when absent); ok is false for any input it does not
// read exactly as encoding/json would (then the caller asks encoding/json).
func topStrings(stdin []byte) (name, version string, ok bool) {
	if !json.Valid(stdin) {
		return "", "", false
	}
	d := jsonlite.NewDecoder(stdin)
	var seenName, seenVersion bool
	read := func(p *string, seen *bool) bool {
		if *seen {
			return false // duplicate keys: encoding/json takes the last; ask it
		}
		*seen = true
		return d.SetStr(p)
	}
	ok = d.Object(func(k string) bool {
		switch {
		case k == "name":
			return read(&name, &seenName)
		case k == "cniVersion":
			return read(&version, &seenVersion)
		case strings.EqualFold(k, "name") || strings.EqualFold(k, "cniVersion"):
			return false // encoding/json matches keys case-insensitively
		}
		_, ok := d.Skip()
		return ok
	}) && d.End()
	return name, version, ok
}

// versionJSON is the VERSION answer, as the library's PluginInfo.Encode writes it.
func versionJSON(versions []string) []byte {
	var b bytes.Buffer
	b.WriteString(`{"cniVersion":`)
	writeStr(&b, CurrentVersion)
	if len(versions) > 0 {
		b.WriteString(`,"supportedVersions":[`)
		for i, v := range versions {
			if i > 0 {
				b.WriteByte(',')
			}
			writeStr(&b, v)
		}
		b.WriteByte(']')
	}
	b.WriteString("}\n")
	return b.Bytes()
}

// CurrentVersion is the newest spec version this package speaks.
const CurrentVersion = "1.1.0"

// writeStr writes s as a JSON string, escaped as encoding/json escapes it.
func writeStr(b *bytes.Buffer, s string) {
	if jsonlite.Plain(s) {
		b.WriteByte('"')
		b.WriteString(s)
		b.WriteByte('"')
		return
	}
	q, _ := json.Marshal(s) // a string always marshals
	b.Write(q)
}
