package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// checkKeys refuses a key of the JSON object raw that no field of t
// takes, naming the nearest known key: a typo ("queus": 4) would
// otherwise run silently with the default. where prefixes the key in the
// error ("handoff."). Keys namespaced with a dot or a slash
// ("cni.dev/valid-attachments") are runtimes' extensions, and accepted.
func checkKeys(raw json.RawMessage, where string, t reflect.Type) error {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return nil // not an object: the typed decode says so
	}
	known := jsonKeys(t)
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if slices.Contains(known, k) || strings.ContainsAny(k, "./") {
			continue
		}
		name := where + k
		if !plainKey(k) {
			// Quoted, so the message still starts with what is at fault
			// when the key is blank or holds ": ".
			name = where + fmt.Sprintf("%q", k)
		}
		if hint, ok := tapPluginKeys[k]; ok && where == "" {
			return invalid(name, "unknown key: the reference tap plugin's; %s (docs/config.md, coming from the tap plugin)", hint)
		}
		if near := nearest(k, known); near != "" {
			return invalid(name, "unknown key; did you mean %q?", near)
		}
		return invalid(name, "unknown key (known: %s)", strings.Join(known, ", "))
	}
	return nil
}

// tapPluginKeys are the reference tap plugin's keys napitap does not take,
// with what to write instead: configs are often carried over from it.
var tapPluginKeys = map[string]string{
	"multiQueue":     `napitap takes "queues", a count (1: single-queue, more: multiqueue)`,
	"selinuxContext": "napitap takes no SELinux context: its tap is made with the plugin's own",
}

// plainKey reports whether k is letters, digits, '_' and '-' only.
func plainKey(k string) bool {
	return k != "" && strings.IndexFunc(k, func(r rune) bool {
		return !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) < 0
}

// jsonKeys are the keys encoding/json decodes into t's fields, those of
// embedded structs included.
func jsonKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case name == "" && f.Anonymous:
			keys = append(keys, jsonKeys(f.Type)...)
		case name == "":
			keys = append(keys, f.Name)
		default:
			keys = append(keys, name)
		}
	}
	slices.Sort(keys)
	return keys
}

// nearest is the known key closest to k by edit distance, ignoring case,
// if it is close enough to be what was meant.
func nearest(k string, known []string) string {
	best, bestDist := "", len(k)/3+1
	for _, c := range known {
		if d := editDistance(strings.ToLower(k), strings.ToLower(c)); d <= bestDist {
			best, bestDist = c, d
		}
	}
	if bestDist > 2 {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, with a swap of two
// adjacent letters ("hadnoff") counted as one edit.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range rb {
		d[0][j+1] = j + 1
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// conventionArgs are args.cni keys that CNI's conventions (CONVENTIONS.md)
// give other plugins of a chain: never taken for a misspelling of
// napitap's, however close.
var conventionArgs = []string{"bandwidth", "deviceID", "infinibandGUID", "ips", "labels", "mac", "portMappings"}

// misspeltPodArgs refuses an args.cni key within one or two edits of one
// of napitap's per-pod keys (PodArgs): a pod's cni-args typo would
// otherwise run with the network's value. Any other key passes: CNI leaves
// args keys a plugin does not know to the chain's other plugins.
func misspeltPodArgs(stdin []byte) error {
	var nested struct {
		Args struct {
			CNI map[string]json.RawMessage `json:"cni"`
		} `json:"args"`
	}
	_ = json.Unmarshal(stdin, &nested)
	known := jsonKeys(reflect.TypeFor[PodArgs]())
	keys := make([]string, 0, len(nested.Args.CNI))
	for k := range nested.Args.CNI {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if slices.Contains(known, k) || slices.Contains(conventionArgs, k) {
			continue
		}
		if near := nearest(k, known); near != "" {
			return invalid("args.cni."+k, "unknown key; did you mean %q? (napitap leaves other plugins' args.cni keys alone, but not a misspelling of its own)", near)
		}
	}
	return nil
}

// unknownKeys checks the network config's own object and its handoff and
// kataDan objects; runtimeConfig and args carry what runtimes add.
func unknownKeys(stdin []byte) error {
	if err := checkKeys(stdin, "", reflect.TypeFor[NetConf]()); err != nil {
		return err
	}
	var nested struct {
		Handoff json.RawMessage `json:"handoff"`
		KataDan json.RawMessage `json:"kataDan"`
	}
	_ = json.Unmarshal(stdin, &nested)
	if err := checkKeys(nested.Handoff, "handoff.", reflect.TypeFor[HandoffConf]()); err != nil {
		return err
	}
	return checkKeys(nested.KataDan, "kataDan.", reflect.TypeFor[KataDanConf]())
}
