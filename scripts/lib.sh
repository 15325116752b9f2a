# shellcheck shell=bash
# Functions the scripts beside this file share. Source it from
# the repository's root.

# modules prints the directory of every module in scripts/modules; with
# "published" or "unpublished", only those.
modules() {
	awk -v want="${1:-}" '!/^[[:space:]]*(#|$)/ && (want == "" || $2 == want) { print $1 }' scripts/modules
}

# module_path prints the path of the module in directory $1.
module_path() {
	awk '$1 == "module" { print $2; exit }' "$1/go.mod"
}

# requires prints "path version" for each requirement in the go.mod of the
# module in directory $1.
requires() {
	awk '
		$1 == "require" && $2 == "(" { block = 1; next }
		block && $1 == ")" { block = 0; next }
		block && NF >= 2 && $1 !~ /^\/\// { print $1, $2; next }
		$1 == "require" && NF >= 3 { print $2, $3 }
	' "$1/go.mod"
}

# tag prints the tag of the module in directory $1 at version $2.
tag() {
	if [ "$1" = . ]; then echo "$2"; else echo "$1/$2"; fi
}

# is_release reports whether $1 is a release version, vX.Y.Z.
is_release() {
	[[ $1 =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]]
}

# check_listed fails unless scripts/modules lists every go.mod of the
# repository, and only those.
check_listed() {
	local found listed
	found=$(git ls-files --cached --others --exclude-standard -- 'go.mod' '*/go.mod' |
		grep -Ev '(^|/)testdata/' | xargs -r -n1 dirname | sort)
	listed=$(modules | sort)
	if [ "$found" != "$listed" ]; then
		echo "scripts/modules does not list the repository's modules:" >&2
		diff <(echo "$listed") <(echo "$found") | sed -n 's/^< /  listed, but has no go.mod: /p; s/^> /  has a go.mod, but is not listed: /p' >&2
		return 1
	fi
}

# release_version prints the one version at which the published modules
# require each other, and fails if they do not agree on one release version.
# (An unpublished module may require them at any version: no user sees it.)
release_version() {
	local published dir versions
	published=$(for dir in $(modules published); do module_path "$dir"; done)
	versions=$(for dir in $(modules published); do
		requires "$dir" | while read -r path version; do
			if grep -qxF "$path" <<<"$published"; then echo "$dir $path $version"; fi
		done
	done)
	local distinct
	distinct=$(awk '{ print $3 }' <<<"$versions" | sort -u)
	if [ -z "$distinct" ] || [ "$(wc -l <<<"$distinct")" -ne 1 ] || ! is_release "$distinct"; then
		echo "the published modules do not require each other at one release version (vX.Y.Z):" >&2
		# shellcheck disable=SC2001 # indents every line: not one substitution
		sed 's/^/  /' <<<"$versions" >&2
		return 1
	fi
	echo "$distinct"
}
