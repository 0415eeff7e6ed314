#!/usr/bin/env bash
# release.sh VERSION prepares a release of every module of the workspace
# together: it sets each module's requirement on its siblings (the core, the
# stores, ...) to VERSION, and prints the tags to create, one per published
# module: VERSION for the core at the root, DIR/VERSION for a module in DIR
# (pgstore/v0.3.0, cmd/idem/v0.3.0, ...), as the go command expects of a
# module in a subdirectory.
#
#   scripts/release.sh v0.3.0       # bump, then print the tags
#   scripts/release.sh -n v0.3.0    # print the tags only, change nothing
#
# The modules are those of go.work (`go list -m`), so a module added there
# is released with the others. Modules nobody imports (bench/, internal/)
# follow the version bump but get no tag. docs/development.md, "Releasing",
# has the whole procedure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dry=false
if [[ "${1:-}" == "-n" ]]; then
	dry=true
	shift
fi
version=${1:?usage: scripts/release.sh [-n] VERSION (for example v0.3.0)}
if ! [[ "$version" =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release.sh: $version is not a semantic version such as v0.3.0" >&2
	exit 2
fi
if [[ "${BASH_REMATCH[1]}" -ge 2 ]]; then
	# A major version from v2 on changes every module path (/v2 suffix).
	echo "release.sh: $version needs a /v${BASH_REMATCH[1]} module path first" >&2
	exit 2
fi

cd "$root"
paths=()
dirs=()
while read -r modpath moddir; do
	paths+=("$modpath")
	dirs+=("${moddir#"$root"}")
done < <(go list -m -f '{{.Path}} {{.Dir}}')

# unpublished reports whether the module in directory $1 (relative to the
# root, "" for the root) is one nobody imports: it gets no tag.
unpublished() {
	case "$1" in
	/bench | /bench/* | /examples | /internal/* | */internal/*) return 0 ;;
	esac
	return 1
}

if ! $dry; then
	for dir in "${dirs[@]}"; do
		gomod="$root$dir/go.mod"
		for p in "${paths[@]}"; do
			# Only siblings the module already requires: go mod edit
			# -require would add the others.
			if grep -Eq "^[[:space:]]*(require[[:space:]]+)?${p//./\\.}[[:space:]]+v" "$gomod"; then
				go mod edit -require="$p@$version" "$gomod"
			fi
		done
	done
	# go.work replaces siblings at their required version (see
	# docs/development.md, "Modules"); those follow the bump too.
	for p in "${paths[@]}"; do
		sed -E -i "s#^([[:space:]]*(replace[[:space:]]+)?${p//./\\.})[[:space:]]+v[^[:space:]]+([[:space:]]+=>)#\\1 $version\\3#" "$root/go.work"
	done
	echo "Every module now requires its siblings at $version. Commit, then create these tags:" >&2
fi
for dir in "${dirs[@]}"; do
	unpublished "$dir" && continue
	if [[ -z "$dir" ]]; then
		echo "$version"
	else
		echo "${dir#/}/$version"
	fi
done
