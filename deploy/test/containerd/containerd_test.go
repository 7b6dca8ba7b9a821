package containerdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	criconfig1 "github.com/containerd/containerd/pkg/cri/config"
	plugin1 "github.com/containerd/containerd/plugin"
	shim1 "github.com/containerd/containerd/runtime/v2/shim"
	srvconfig1 "github.com/containerd/containerd/services/server/config"
	srvconfig2 "github.com/containerd/containerd/v2/cmd/containerd/server/config"
	shim2 "github.com/containerd/containerd/v2/pkg/shim"
	plugins2 "github.com/containerd/containerd/v2/plugins"
	toml1 "github.com/pelletier/go-toml"
	toml2 "github.com/pelletier/go-toml/v2"
)

// kataDir holds the snippets and the wrapper (this module is deploy/test/containerd).
var kataDir = filepath.Join("..", "..", "kata")

const (
	kataHandler = "kata-napitap"                    // the README's RuntimeClass handler
	kataShim    = "containerd-shim-kata-napitap-v2" // the wrapper
	// Where deploy/overlays/kata installs it on a node: containerd runs
	// runtime_path, when set, rather than look the name up in its PATH.
	kataInstalled = "/opt/napitap/bin/" + kataShim
)

// kataRuntime is what containerd makes of the kata-napitap runtime table.
type kataRuntime struct {
	shim       string // the binary containerd derives from runtime_type
	path       string // runtime_path, which containerd runs rather than look shim up
	configPath string // the options' ConfigPath, which runtime-rs reads
}

// Each containerd snippet, decoded as that containerd decodes it, with its
// own types and TOML library, runs the wrapper for the kata-napitap handler
// with runtime-rs's configuration. containerd ignores a key it does not know
// (1.x silently, 2.x with a warning), so these decode strictly: a misspelt
// key would otherwise drop its setting without a word.
func TestContainerdRunsTheKataWrapper(t *testing.T) {
	tests := []struct {
		name   string
		file   string
		decode func(t *testing.T, snippet []byte) kataRuntime
	}{
		{"containerd 1.6 and 1.7 run the wrapper", "containerd-config.toml", containerd1Runtime},
		{"containerd 2.x runs the wrapper", "containerd2-config.toml", containerd2Runtime},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snippet, err := os.ReadFile(filepath.Join(kataDir, tt.file))
			if err != nil {
				t.Fatal(err)
			}
			rt := tt.decode(t, snippet)
			if rt.shim != kataShim {
				t.Errorf("%s: containerd runs %q for %s, want the wrapper %s", tt.file, rt.shim, kataHandler, kataShim)
			}
			if _, err := os.Stat(filepath.Join(kataDir, rt.shim)); err != nil {
				t.Errorf("%s: no shim of the name containerd runs: %v", tt.file, err)
			}
			if rt.path != kataInstalled {
				t.Errorf("%s: runtime_path %q, want the wrapper where deploy/overlays/kata installs it, %s", tt.file, rt.path, kataInstalled)
			}
			if !strings.Contains(rt.configPath, "/runtime-rs/configuration-") {
				t.Errorf("%s: ConfigPath %q is not a runtime-rs configuration", tt.file, rt.configPath)
			}
		})
	}
}

// containerd1Runtime decodes the 1.6/1.7 snippet as containerd 1.7 does,
// appended to the config.toml `containerd config default` writes (alone it
// would fail validation: its runtimes table replaces the defaults' map, runc
// with it): go-toml v1 into the server's Config, the CRI plugin's table into
// its PluginConfig over the defaults, ValidatePluginConfig, and the runtime's
// options into the type the CRI plugin sends a runtime other than runc's
// (the API module's: 1.7's pkg/runtimeoptions/v1 registers the same message,
// and one binary cannot link both).
func containerd1Runtime(t *testing.T, snippet []byte) kataRuntime {
	id := string(plugin1.GRPCPlugin) + ".cri"
	defaults, err := toml1.Marshal(map[string]any{"version": 2, "plugins": map[string]any{id: criconfig1.DefaultConfig()}})
	if err != nil {
		t.Fatal(err)
	}
	// Strict cannot see through Config.Plugins, a map of toml.Tree, so the
	// snippet's top level is checked against Config's keys, and each plugin
	// below.
	own, err := toml1.LoadBytes(snippet)
	if err != nil {
		t.Fatalf("containerd 1.x config: %v", err)
	}
	for _, k := range own.Keys() {
		if !hasTomlKey(reflect.TypeFor[srvconfig1.Config](), k) {
			t.Errorf("containerd 1.x config: unknown key %q", k)
		}
	}
	doc, err := toml1.LoadBytes(append(append(defaults, '\n'), snippet...))
	if err != nil {
		t.Fatalf("containerd 1.x config: %v", err)
	}
	var cfg srvconfig1.Config
	if err := doc.Unmarshal(&cfg); err != nil {
		t.Fatalf("containerd 1.x config: %v", err)
	}
	if err := cfg.ValidateV2(); err != nil {
		t.Fatalf("containerd 1.x config: %v", err)
	}
	for p := range cfg.Plugins {
		if p != id {
			t.Errorf("containerd 1.x config: plugin %s, want only %s", p, id)
		}
	}
	tree, ok := cfg.Plugins[id]
	if !ok {
		t.Fatalf("containerd 1.x config: no plugin %s", id)
	}
	cri := criconfig1.DefaultConfig()
	if err := decodeToml1([]byte(tree.String()), &cri); err != nil {
		t.Fatalf("plugin %s: %v", id, err)
	}
	if warnings, err := criconfig1.ValidatePluginConfig(context.Background(), &cri); err != nil || len(warnings) > 0 {
		t.Fatalf("plugin %s: %v, deprecated: %v", id, err, warnings)
	}
	r, ok := cri.ContainerdConfig.Runtimes[kataHandler]
	if !ok {
		t.Fatalf("plugin %s: no runtime %s", id, kataHandler)
	}
	options, err := toml1.TreeFromMap(r.Options)
	if err != nil {
		t.Fatalf("runtime %s options: %v", kataHandler, err)
	}
	var opts runtimeoptions.Options
	if err := decodeToml1([]byte(options.String()), &opts); err != nil {
		t.Fatalf("runtime %s options: %v", kataHandler, err)
	}
	return kataRuntime{shim: shim1.BinaryName(r.Type), path: r.Path, configPath: opts.ConfigPath}
}

func hasTomlKey(typ reflect.Type, key string) bool {
	for f := range typ.Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("toml"), ","); name == key {
			return true
		}
	}
	return false
}

func decodeToml1(b []byte, v any) error {
	return toml1.NewDecoder(bytes.NewReader(b)).Strict(true).Decode(v)
}

// containerd2Runtime decodes the 2.x snippet as containerd 2.x does, as the
// drop-in the README makes it: config.toml imports it, and LoadConfig merges
// its runtime into the CRI runtime table config.toml already has (go-toml v2
// into the server's Config). Then the plugin's table, re-encoded, into its
// RuntimeConfig, and the runtime's options into the type the CRI plugin
// sends a runtime other than runc's. RuntimeConfig lives in
// internal/cri/config, which Go lets no other module import, and so does
// its ValidateRuntimeConfig: the type is rebuilt from that package's source
// (containerd2ConfigType), and nothing validates beyond decoding.
func containerd2Runtime(t *testing.T, snippet []byte) kataRuntime {
	var own srvconfig2.Config
	if err := decodeToml2(snippet, &own); err != nil {
		t.Fatalf("containerd 2.x config: %v", err)
	}
	if own.Version != 3 {
		t.Errorf("containerd 2.x config: version %d, want 3 (2.0 reads up to 3, later ones migrate it)", own.Version)
	}
	id := string(plugins2.CRIServicePlugin) + ".runtime"
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "conf.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "conf.d", "kata-napitap.toml"), snippet, 0o644); err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(main, []byte(`version = 3
imports = ["conf.d/*.toml"]
[plugins.'`+id+`'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg srvconfig2.Config
	if err := srvconfig2.LoadConfig(context.Background(), main, &cfg); err != nil {
		t.Fatalf("containerd 2.x config: %v", err)
	}
	data, ok := cfg.Plugins[id]
	if !ok {
		t.Fatalf("containerd 2.x config: no plugin %s", id)
	}
	b, err := toml2.Marshal(data)
	if err != nil {
		t.Fatalf("plugin %s: %v", id, err)
	}
	cri := reflect.New(containerd2ConfigType(t, "RuntimeConfig"))
	if err := decodeToml2(b, cri.Interface()); err != nil {
		t.Fatalf("plugin %s: %v", id, err)
	}
	runtimes := cri.Elem().FieldByName("ContainerdConfig").FieldByName("Runtimes")
	if !runtimes.MapIndex(reflect.ValueOf("runc")).IsValid() {
		t.Errorf("plugin %s: the drop-in took away config.toml's runtime runc", id)
	}
	r := runtimes.MapIndex(reflect.ValueOf(kataHandler))
	if !r.IsValid() {
		t.Fatalf("plugin %s: no runtime %s", id, kataHandler)
	}
	b, err = toml2.Marshal(r.FieldByName("Options").Interface())
	if err != nil {
		t.Fatalf("runtime %s options: %v", kataHandler, err)
	}
	var opts runtimeoptions.Options
	if err := decodeToml2(b, &opts); err != nil {
		t.Fatalf("runtime %s options: %v", kataHandler, err)
	}
	return kataRuntime{shim: shim2.BinaryName(r.FieldByName("Type").String()), path: r.FieldByName("Path").String(), configPath: opts.ConfigPath}
}

func decodeToml2(b []byte, v any) error {
	err := toml2.NewDecoder(bytes.NewReader(b)).DisallowUnknownFields().Decode(v)
	if serr := (*toml2.StrictMissingError)(nil); errors.As(err, &serr) {
		return fmt.Errorf("%w:\n%s", err, serr.String())
	}
	return err
}

// containerd2ConfigType rebuilds a struct type of containerd 2.x's
// internal/cri/config, field names, types and tags, from its config.go in
// the module cache at the version go.mod requires, so that decoding into it
// knows exactly the keys and value types containerd does.
func containerd2ConfigType(t *testing.T, name string) reflect.Type {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/containerd/containerd/v2").Output()
	if err != nil {
		t.Fatalf("go list containerd/v2: %v", err)
	}
	file := filepath.Join(strings.TrimSpace(string(out)), "internal", "cri", "config", "config.go")
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	decls := map[string]ast.Expr{}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
			for _, s := range g.Specs {
				decls[s.(*ast.TypeSpec).Name.Name] = s.(*ast.TypeSpec).Type
			}
		}
	}
	basic := map[string]reflect.Type{
		"string": reflect.TypeFor[string](), "bool": reflect.TypeFor[bool](),
		"int": reflect.TypeFor[int](), "any": reflect.TypeFor[any](),
	}
	var build func(ast.Expr) reflect.Type
	build = func(e ast.Expr) reflect.Type {
		switch e := e.(type) {
		case *ast.Ident:
			if typ, ok := basic[e.Name]; ok {
				return typ
			}
			if d, ok := decls[e.Name]; ok {
				return build(d)
			}
		case *ast.ArrayType:
			if e.Len == nil {
				return reflect.SliceOf(build(e.Elt))
			}
		case *ast.MapType:
			return reflect.MapOf(build(e.Key), build(e.Value))
		case *ast.InterfaceType:
			if e.Methods.NumFields() == 0 {
				return basic["any"]
			}
		case *ast.StructType:
			var fields []reflect.StructField
			for _, fd := range e.Fields.List {
				tag := ""
				if fd.Tag != nil {
					tag, _ = strconv.Unquote(fd.Tag.Value)
				}
				names := fd.Names
				if len(names) == 0 { // embedded: a table of its own when tagged, inline when not
					id, ok := fd.Type.(*ast.Ident)
					if !ok {
						t.Fatalf("%s: %s embeds a type this test cannot rebuild: %#v", file, name, fd.Type)
					}
					names = []*ast.Ident{id}
				}
				for _, n := range names {
					if n.IsExported() {
						fields = append(fields, reflect.StructField{Name: n.Name, Type: build(fd.Type),
							Tag: reflect.StructTag(tag), Anonymous: len(fd.Names) == 0 && tag == ""})
					}
				}
			}
			return reflect.StructOf(fields)
		}
		t.Fatalf("%s: %s has a type this test cannot rebuild: %#v", file, name, e)
		return nil
	}
	d, ok := decls[name]
	if !ok {
		t.Fatalf("%s: no type %s", file, name)
	}
	return build(d)
}
