#!/usr/bin/env bash
# Regenerates tests/cases/upstream-shortnames.txt: every ConformanceTest of the upstream
# Gateway API conformance suite (the Go module `sigs.k8s.io/gateway-api/conformance`, a
# module of its own beside `sigs.k8s.io/gateway-api`, both at the version
# tests/k8s/crds.sh uses) in conformance/tests/*.go (the Gateway tests; the mesh tests are
# in conformance/tests/mesh/), one a line:
#
#   ShortName<TAB>profiles<TAB>features<TAB>provisional|-
#
# A test belongs to a profile when every feature it requires is one of the profile's core
# or extended features (upstream `getConformanceProfilesForTest`, utils/suite/profiles.go);
# profiles `-`: the test is in none of the five (it needs features of two profiles, or one
# no profile lists), so upstream reports never count it, but it is listed all the same.
# The module sources are read with go/ast (Go's standard library only, nothing built from
# the modules): ShortName and Features of each `suite.ConformanceTest` in
# conformance/tests/*.go, the feature names and sets of pkg/features/*.go, the profiles of
# conformance/utils/suite/profiles.go.
#
# `cargo test --test standalone upstream_coverage` checks tests/cases/upstream-coverage.yaml
# against the committed snapshot offline; rerun this when the version changes.
# Usage: tests/cases/upstream-shortnames.sh [--check]   (--check: exit 1 if the snapshot differs)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(sed -n 's/^version="\(v[0-9.]*\)"$/\1/p' "$here/../k8s/crds.sh")"
[ -n "$version" ] || { echo "no version in tests/k8s/crds.sh" >&2; exit 1; }
command -v go >/dev/null 2>&1 || { echo "no Go toolchain" >&2; exit 3; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# Outside any module (a scratch directory); checked against the Go checksum database.
dl() { (cd "$scratch" && GOFLAGS=-mod=mod go mod download -json "$1@$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'); }
api="$(dl sigs.k8s.io/gateway-api)"
conf="$(dl sigs.k8s.io/gateway-api/conformance)"
[ -d "$api/pkg/features" ] && [ -d "$conf/tests" ] || {
  echo "go mod download gave no pkg/features or conformance/tests (api '$api', conformance '$conf')" >&2
  exit 1
}
cat >"$scratch/main.go" <<'GO'
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

func parseDir(dir string) []*ast.File {
	paths, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		files = append(files, f)
	}
	return files
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
	os.Exit(1)
}

var (
	consts   = map[string]string{}   // SupportX -> "X"
	feats    = map[string]ast.Expr{} // XFeature -> Feature{...}
	featSets = map[string]ast.Expr{} // XFeatures -> sets.New(...)
)

// names resolves an expression of pkg/features to feature names.
func names(e ast.Expr) []string {
	switch e := e.(type) {
	case *ast.SelectorExpr:
		return names(e.Sel)
	case *ast.Ident:
		if v, ok := consts[e.Name]; ok {
			return []string{v}
		}
		if v, ok := feats[e.Name]; ok {
			return names(v)
		}
		if v, ok := featSets[e.Name]; ok {
			return names(v)
		}
		fail("unresolved feature identifier %s", e.Name)
	case *ast.CompositeLit: // Feature{Name: SupportX, ...} or []FeatureName{...}
		var out []string
		for _, el := range e.Elts {
			if kv, ok := el.(*ast.KeyValueExpr); ok {
				if k, _ := kv.Key.(*ast.Ident); k != nil && k.Name == "Name" {
					out = append(out, names(kv.Value)...)
				}
				continue
			}
			out = append(out, names(el)...)
		}
		return out
	case *ast.CallExpr: // sets.New(...), SetsToNamesSet(...), x.Insert(...), y.UnsortedList()
		var out []string
		if sel, ok := e.Fun.(*ast.SelectorExpr); ok {
			if _, isCall := sel.X.(*ast.CallExpr); isCall {
				out = append(out, names(sel.X)...)
			}
		}
		for _, a := range e.Args {
			out = append(out, names(a)...)
		}
		return out
	case *ast.BasicLit:
		s, _ := strconv.Unquote(e.Value)
		return []string{s}
	}
	fail("unexpected expression %T in features", e)
	return nil
}

func main() {
	api, conf := os.Args[1], os.Args[2]
	for _, f := range parseDir(filepath.Join(api, "pkg/features")) {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, s := range g.Specs {
				vs, ok := s.(*ast.ValueSpec)
				if !ok {
					continue
				}
				for i, n := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					v := vs.Values[i]
					switch {
					case g.Tok == token.CONST:
						if bl, ok := v.(*ast.BasicLit); ok && bl.Kind == token.STRING {
							consts[n.Name], _ = strconv.Unquote(bl.Value)
						}
					case strings.HasSuffix(n.Name, "Features"):
						featSets[n.Name] = v
					default:
						feats[n.Name] = v
					}
				}
			}
		}
	}
	// Profiles.
	type profile struct {
		name     string
		features map[string]bool
	}
	var profiles []profile
	suiteFiles := parseDir(filepath.Join(conf, "utils/suite"))
	profileNames := map[string]string{}
	for _, f := range suiteFiles {
		ast.Inspect(f, func(n ast.Node) bool {
			if vs, ok := n.(*ast.ValueSpec); ok {
				for i, id := range vs.Names {
					if i < len(vs.Values) {
						if bl, ok := vs.Values[i].(*ast.BasicLit); ok && strings.HasSuffix(id.Name, "ConformanceProfileName") {
							profileNames[id.Name], _ = strconv.Unquote(bl.Value)
						}
					}
				}
			}
			return true
		})
	}
	for _, f := range suiteFiles {
		ast.Inspect(f, func(n ast.Node) bool {
			cl, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			if id, ok := cl.Type.(*ast.Ident); !ok || id.Name != "ConformanceProfile" {
				return true
			}
			p := profile{features: map[string]bool{}}
			for _, el := range cl.Elts {
				kv := el.(*ast.KeyValueExpr)
				switch kv.Key.(*ast.Ident).Name {
				case "Name":
					p.name = profileNames[kv.Value.(*ast.Ident).Name]
				case "CoreFeatures", "ExtendedFeatures":
					for _, name := range names(kv.Value) {
						p.features[name] = true
					}
				}
			}
			if strings.HasPrefix(p.name, "GATEWAY-") {
				profiles = append(profiles, p)
			}
			return true
		})
	}
	if len(profiles) != 5 {
		fail("found %d Gateway profiles, want 5", len(profiles))
	}
	sort.Slice(profiles, func(i, j int) bool { return profiles[i].name < profiles[j].name })
	// Tests.
	var lines []string
	for _, f := range parseDir(filepath.Join(conf, "tests")) {
		ast.Inspect(f, func(n ast.Node) bool {
			cl, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := cl.Type.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "ConformanceTest" {
				return true
			}
			var short string
			var features []string
			provisional := "-"
			for _, el := range cl.Elts {
				kv := el.(*ast.KeyValueExpr)
				switch kv.Key.(*ast.Ident).Name {
				case "ShortName":
					bl, ok := kv.Value.(*ast.BasicLit)
					if !ok {
						fail("ShortName is not a string literal")
					}
					short, _ = strconv.Unquote(bl.Value)
				case "Features":
					features = names(kv.Value)
				case "Provisional":
					if id, ok := kv.Value.(*ast.Ident); ok && id.Name == "true" {
						provisional = "provisional"
					}
				}
			}
			if short == "" {
				fail("a ConformanceTest without ShortName")
			}
			var in []string
			for _, p := range profiles {
				all := true
				for _, ft := range features {
					if !p.features[ft] {
						all = false
					}
				}
				if all {
					in = append(in, p.name)
				}
			}
			profs := strings.Join(in, ",")
			if profs == "" {
				profs = "-"
			}
			lines = append(lines, fmt.Sprintf("%s\t%s\t%s\t%s", short, profs, strings.Join(features, ","), provisional))
			return true
		})
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
}
GO
out="$scratch/out.txt"
{
  echo "# Generated by tests/cases/upstream-shortnames.sh from sigs.k8s.io/gateway-api/conformance@$version: do not edit."
  echo "# ShortName<TAB>profiles<TAB>features<TAB>provisional|-"
  (cd "$scratch" && GO111MODULE=off go run main.go "$api" "$conf")
} >"$out"
if [ "${1:-}" = "--check" ]; then
  diff -u "$here/upstream-shortnames.txt" "$out"
else
  cp "$out" "$here/upstream-shortnames.txt"
  echo "wrote $here/upstream-shortnames.txt ($(grep -vc '^#' "$out") tests)"
fi
