#!/usr/bin/env bash
# Proves that every test source compiles on its own includes, without the precompiled headers that
# the build gives them (see Note [Catch2's CHECK against c10's] in tests/catch.h): each test TU's
# own compile command from BUILD_DIR/compile_commands.json, less the precompiled header, run with
# -fsyntax-only (parsing and templates, no code: about a third of a full compile). A source the
# build compiled without a precompiled header (the launcher's tests) has already proved it there
# and is not compiled again.
# usage: check_no_pch.sh [BUILD_DIR] [REGEX of source paths, default: the tests' sources]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-${CPPRUN_BUILD_DIR:-build}}
pattern=${2:-/tests/.*\.cpp$}
db="$build_dir/compile_commands.json"
[ -f "$db" ] || { echo "check_no_pch: no $db: configure with scripts/build.sh first" >&2; exit 1; }
list=$(mktemp -d)
trap 'rm -rf "$list"' EXIT
# One script per source: cd to its directory, then its command with the precompiled header, the
# output file and the compiler launcher (ccache) taken out.
python3 - "$db" "$pattern" "$list" <<'PY'
import json, re, shlex, sys
db, pattern, out = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3]
count = skipped = 0
for entry in json.load(open(db)):
    if not pattern.search(entry["file"]):
        continue
    args = entry.get("arguments") or shlex.split(entry["command"])
    if not any(a == "-include" and b.endswith("cmake_pch.hxx") for a, b in zip(args, args[1:])):
        skipped += 1
        continue
    if "ccache" in args[0]:
        args = args[1:]
    kept, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "-include" and args[i + 1].endswith("cmake_pch.hxx"):
            skip = True
            continue
        if a == "-o":
            skip = True
            continue
        if a in ("-Winvalid-pch",):
            continue
        kept.append(a)
    kept.append("-fsyntax-only")
    count += 1
    with open(f"{out}/{count:03d}.sh", "w") as f:
        f.write(f"# {entry['file']}\ncd {shlex.quote(entry['directory'])} && {shlex.join(kept)}\n")
with open(f"{out}/skipped", "w") as f:
    f.write(f"{skipped}\n")
PY
total=$(ls "$list"/*.sh 2>/dev/null | wc -l)
skipped=$(cat "$list/skipped")
[ "$total" -gt 0 ] || [ "$skipped" -gt 0 ] || { echo "check_no_pch: no source in $db matches '$pattern'" >&2; exit 1; }
if [ "$total" -eq 0 ]; then
  echo "check_no_pch: the build gave none of its $skipped sources a precompiled header: nothing to prove"
  exit 0
fi
echo "check_no_pch: compiling $total sources without the precompiled header ($(nproc) at a time;" \
     "$skipped more were built without one)"
start=$(date +%s)
failed=0
# shellcheck disable=SC2016
ls "$list"/*.sh | xargs -P "$(nproc)" -I{} bash -c 'out=$(bash "$1" 2>&1) || { echo "check_no_pch: FAILED: $(head -1 "$1" | cut -c3-)"; echo "$out" | head -40; exit 1; }' _ {} \
  || failed=1
echo "check_no_pch: $total sources in $(( $(date +%s) - start )) s"
[ "$failed" = 0 ] || { echo "check_no_pch: FAIL: some sources do not compile without the precompiled header (above)"; exit 1; }
echo "check_no_pch: every source compiles without the precompiled header"
