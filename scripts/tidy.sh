#!/usr/bin/env bash
# tidy.sh runs `go mod tidy` (or `go get ARGS...`) in one module of the
# workspace. The modules require each other at the version they will be
# released with (see docs/development.md, "Releasing"), which the module proxy
# does not serve before the tags are pushed; go.work wires them for builds,
# but `go mod tidy` and `go get` ignore go.work. So this script points every
# sibling at its directory with temporary replace directives, runs the
# command, and removes them again: no go.mod a user depends on keeps a
# replace.
#
#   scripts/tidy.sh pgstore                      # go mod tidy in ./pgstore
#   scripts/tidy.sh idemnats go get github.com/nats-io/nats.go@v1.55.0
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: scripts/tidy.sh MODULE_DIR [go get ARGS...]}
shift
cd "$root/$dir"
if grep -q '^replace' go.mod; then
	# A module nobody depends on (bench) keeps its own replace directives.
	if [[ $# -gt 0 ]]; then "$@"; fi
	exec go mod tidy
fi
mods=()
while read -r modpath moddir; do
	mods+=("$modpath=$moddir")
done < <(cd "$root" && go list -m -f '{{.Path}} {{.Dir}}')
cleanup() {
	for m in "${mods[@]}"; do go mod edit -dropreplace "${m%%=*}"; done
}
trap cleanup EXIT
self=$(go list -m)
for m in "${mods[@]}"; do
	[[ "${m%%=*}" == "$self" ]] && continue
	go mod edit -replace "$m"
done
if [[ $# -gt 0 ]]; then "$@"; fi
go mod tidy
