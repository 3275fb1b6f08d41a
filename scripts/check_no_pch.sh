#!/usr/bin/env bash
# Proves that every test source compiles on its own includes, without the precompiled headers that
# the build gives them (see Note [Catch2's CHECK against c10's] in tests/catch.h). For each test
# source in BUILD_DIR/compile_commands.json (a unity build's TU stands for the sources it includes):
#   - built without a precompiled header (the launcher's tests): the build proved it; not compiled.
#   - its first includes are the precompiled header's own headers, in any order (<torch/torch.h>
#     standing for <ATen/ATen.h>, which it includes): it cannot lean on the header for anything it
#     does not include itself, and what differs without the header is only the order of those few
#     headers. One such source per precompiled header, the witness, is compiled to prove that order
#     harmless; the others are not compiled (each would cost about 32 s on 2 cores).
#   - any other: its own compile command less the precompiled header, run with -fsyntax-only.
# usage: check_no_pch.sh [BUILD_DIR] [REGEX of source paths, default: the tests' sources]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-${CPPRUN_BUILD_DIR:-build}}
pattern=${2:-/tests/.*\.cpp$}
db="$build_dir/compile_commands.json"
[ -f "$db" ] || { echo "check_no_pch: no $db: configure with scripts/build.sh first" >&2; exit 1; }
list=$(mktemp -d)
trap 'rm -rf "$list"' EXIT
# One script per source to compile: cd to its directory, then its command with the precompiled
# header, the output and dependency files and the compiler launcher (ccache) taken out.
python3 - "$db" "$pattern" "$list" <<'PY'
import json, os, re, shlex, sys
db, pattern, out = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3]
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)


def without_pch(args, source):
    """`args` compiling `source` alone: no precompiled header, output, dependency file or launcher."""
    if "ccache" in args[0]:
        args = args[1:]
    kept, skip = [], 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if a == "-include" and args[i + 1].endswith("cmake_pch.hxx"):
            skip = 1
        elif a in ("-o", "-MT", "-MF", "-MQ"):
            skip = 1
        elif a in ("-Winvalid-pch", "-MD", "-MMD"):
            pass
        elif a == "-c":
            kept += ["-c", source]
            skip = 1
        else:
            kept.append(a)
    return kept + ["-fsyntax-only"]


def includes(path, directory, search):
    """Each #include of `path`, in order: '<name>' for a system one, the real path for a quoted one
    found (next to `path`, then in the -I folders), else '"name"'."""
    found = []
    for kind, name in INCLUDE.findall(open(path).read()):
        if kind == "<":
            found.append(f"<{name}>")
            continue
        for folder in [os.path.dirname(path)] + [os.path.join(directory, d) for d in search]:
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate):
                found.append(os.path.realpath(candidate))
                break
        else:
            found.append(f'"{name}"')
    return found


def own_first_includes(source, pch, directory, search):
    """Whether `source` opens with exactly the headers `pch` precompiles (any order)."""
    held = includes(pch, directory, search)
    first = includes(source, directory, search)[:len(held)]
    stands_for = {"<torch/torch.h>": {"<torch/torch.h>", "<ATen/ATen.h>"}}
    covered = set()
    for header in first:
        covered |= stands_for.get(header, {header})
    return bool(held) and set(held) <= covered and all(stands_for.get(h, {h}) & set(held) for h in first)


compile_these, proved, witnessed = [], 0, {}
built_without = 0
for entry in json.load(open(db)):
    args = entry.get("arguments") or shlex.split(entry["command"])
    # A unity build's TU (Note [Unity build] in CMakeLists.txt) includes its sources: each is judged
    # alone here, which also proves that it does not lean on its neighbours' includes.
    if "/Unity/unity_" in entry["file"]:
        sources = [p for _, p in INCLUDE.findall(open(entry["file"]).read()) if p.endswith(".cpp")]
    else:
        sources = [entry["file"]]
    sources = [s for s in sources if pattern.search(s)]
    pch = [b for a, b in zip(args, args[1:]) if a == "-include" and b.endswith("cmake_pch.hxx")]
    if not pch:
        built_without += len(sources)
        continue
    search = [a[2:] for a in args if a.startswith("-I") and len(a) > 2] + \
             [b for a, b in zip(args, args[1:]) if a in ("-I", "-isystem")]
    for source in sorted(sources):
        if own_first_includes(source, pch[0], entry["directory"], search) and pch[0] in witnessed:
            proved += 1
            continue
        if own_first_includes(source, pch[0], entry["directory"], search):
            witnessed[pch[0]] = source
        compile_these.append((source, entry["directory"], without_pch(args, source)))
for n, (source, directory, command) in enumerate(compile_these, 1):
    with open(f"{out}/{n:03d}.sh", "w") as f:
        f.write(f"# {source}\ncd {shlex.quote(directory)} && {shlex.join(command)}\n")
with open(f"{out}/counts", "w") as f:
    f.write(f"{built_without} {proved} {len(witnessed)}\n")
PY
total=$(ls "$list"/*.sh 2>/dev/null | wc -l)
read -r built_without proved witnesses < "$list/counts"
[ $(( total + built_without + proved )) -gt 0 ] || { echo "check_no_pch: no source in $db matches '$pattern'" >&2; exit 1; }
echo "check_no_pch: $built_without sources were built without a precompiled header; $proved open with its" \
     "own headers (and $witnesses like them are compiled as witnesses)"
if [ "$total" -eq 0 ]; then
  echo "check_no_pch: nothing to compile"
  exit 0
fi
echo "check_no_pch: compiling $total sources without the precompiled header ($(nproc) at a time)"
start=$(date +%s)
failed=0
# shellcheck disable=SC2016
ls "$list"/*.sh | xargs -P "$(nproc)" -I{} bash -c 'out=$(bash "$1" 2>&1) || { echo "check_no_pch: FAILED: $(head -1 "$1" | cut -c3-)"; echo "$out" | head -40; exit 1; }' _ {} \
  || failed=1
echo "check_no_pch: $total sources in $(( $(date +%s) - start )) s"
[ "$failed" = 0 ] || { echo "check_no_pch: FAIL: some sources do not compile without the precompiled header (above)"; exit 1; }
echo "check_no_pch: every source compiles without the precompiled header"
