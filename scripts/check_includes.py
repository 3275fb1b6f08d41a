#!/usr/bin/env python3
"""Checks the launcher's folder layering and the library's bottom layer, from the #include lines.

The launcher's folders are layers, each including only itself and the layers before it
(docs/development.md, "Layout"):
    common <- command_line <- diagnosis <- workers <- rendezvous <- main.cpp
so there can be no include cycle between folders. Of the library it may include only the
LibTorch-free headers named in LAUNCHER_MAY_INCLUDE. The library's support/ is its bottom layer:
it includes nothing of comm/ or anything above it.

Prints the folder-level include graph of launcher/ (each edge with how many #include lines make
it), then every violation as FILE:LINE: the include, and every cycle between folders or between
files. Exit 1 if there is one. Usage: check_includes.py [REPO_ROOT]."""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')

# Bottom first: a folder may include its own files and those of the folders before it.
LAUNCHER_LAYERS = ["common", "command_line", "diagnosis", "workers", "rendezvous", "main"]
# The library's headers that need no LibTorch: the only ones the launcher (which links none) includes.
LAUNCHER_MAY_INCLUDE = {"cpprun/env_lookup.h", "cpprun/launcher_contract.h", "support/json.h"}
# What support/ must not include: every library folder above it.
ABOVE_SUPPORT = ["comm", "core", "ddp", "fsdp", "tp", "pipeline", "training", "checkpoint", "nn", "sampler"]
# Upward includes known and not yet removed, each with why: printed on every run, never a failure.
# Only an exact (file, include) pair is let through, so no new upward include hides behind one.
KNOWN = {}


def sources(folder):
    for base, dirs, files in os.walk(os.path.join(root, folder)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".h", ".cpp")):
                yield os.path.relpath(os.path.join(base, name), root)


def includes(path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            match = INCLUDE.match(line)
            if match:
                yield number, match.group(1)


def launcher_layer(path):  # "launcher/workers/attempt.h" -> "workers"; "launcher/main.cpp" -> "main"
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else "main"


def find_cycle(graph):
    """One cycle of `graph` (node -> set of nodes) as a list of nodes, or None."""
    state = {}  # absent: unvisited, 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        path.append(node)
        for succ in sorted(graph.get(node, ())):
            if state.get(succ) == 1:
                return path[path.index(succ):] + [succ]
            if succ not in state:
                found = visit(succ, path)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def main():
    problems = []
    folder_edges = {}  # (from, to) -> count
    file_graph = {}  # launcher header/source -> launcher headers it includes
    rank = {layer: i for i, layer in enumerate(LAUNCHER_LAYERS)}
    for path in sources("launcher"):
        layer = launcher_layer(path)
        if layer not in rank:
            problems.append(f"{path}: in launcher/{layer}/, a folder that is not a layer of LAUNCHER_LAYERS")
            continue
        for number, name in includes(path):
            target = name.split("/")[0]
            if target in rank and target != "main":
                if os.path.exists(os.path.join(root, "launcher", name)):
                    file_graph.setdefault(path, set()).add("launcher/" + name)
                if target != layer:
                    folder_edges[(layer, target)] = folder_edges.get((layer, target), 0) + 1
                if rank[target] > rank[layer]:
                    problems.append(f"{path}:{number}: #include \"{name}\": {layer}/ includes {target}/, "
                                    "a layer above it")
            elif os.path.exists(os.path.join(root, name)) or os.path.exists(os.path.join(root, "include", name)):
                if name not in LAUNCHER_MAY_INCLUDE:
                    problems.append(f"{path}:{number}: #include \"{name}\": the launcher includes only "
                                    f"{', '.join(sorted(LAUNCHER_MAY_INCLUDE))} of the library's")
    known = []
    for path in sources("support"):
        for number, name in includes(path):
            if name.split("/")[0] in ABOVE_SUPPORT:
                where = f"{path}:{number}: #include \"{name}\": support/ is the library's bottom layer"
                if (path, name) in KNOWN:
                    known.append(f"{where}; known: {KNOWN[(path, name)]}")
                else:
                    problems.append(where)

    print("launcher/ folder include graph (from -> to: #include lines):")
    for layer in LAUNCHER_LAYERS:
        targets = sorted(((t, n) for (f, t), n in folder_edges.items() if f == layer), key=lambda e: rank[e[0]])
        print(f"  {layer:<12} -> " + (", ".join(f"{t} ({n})" for t, n in targets) if targets else "(nothing)"))
    folder_cycle = find_cycle({f: {t for (g, t) in folder_edges if g == f} for (f, _) in folder_edges})
    if folder_cycle:
        problems.append("folder cycle: " + " -> ".join(folder_cycle))
    file_cycle = find_cycle(file_graph)
    if file_cycle:
        problems.append("file cycle: " + " -> ".join(file_cycle))
    print("layers, bottom first: " + " <- ".join(LAUNCHER_LAYERS))
    for line in known:
        print("allowed for now: " + line)
    if problems:
        print(f"\n{len(problems)} problem(s):")
        for problem in problems:
            print("  " + problem)
        return 1
    print("no include cycles; every include goes down the layers; support/ includes nothing above it"
          + (" but what is allowed for now" if known else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
