#!/usr/bin/env bash
# actionlint (github.com/rhysd/actionlint), the GitHub Actions workflow linter, built
# once from the Go module proxy into target/tools/actionlint/; prints its path.
# tests/chart/check.sh lints .github/workflows/ with it: the release workflow cannot run
# in this project's CI, so a linter is what catches its mistakes here. It also checks
# every `run:` script with shellcheck when that is installed.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
version="v1.7.12"
dir="${CARGO_TARGET_DIR:-$root/target}/tools/actionlint"
bin="$dir/actionlint"
if [[ ! -x "$bin" ]] || [[ "$(cat "$dir/.version" 2>/dev/null)" != "$version" ]]; then
  mkdir -p "$dir"
  GOBIN="$dir" GOFLAGS=-mod=mod go install "github.com/rhysd/actionlint/cmd/actionlint@$version" >&2
  echo "$version" >"$dir/.version"
fi
echo "$bin"
