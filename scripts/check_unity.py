#!/usr/bin/env python3
"""Checks that the sources of the targets compiled as unity builds are safe to be: no two sources of
one target give the same name internal linkage (an anonymous namespace's or a namespace-scope
`static`'s), none has a `using namespace` at namespace scope, and none leaves a macro defined.

The library (`cpprun_dist`) and the launcher's core (`cpprun_launcher_core`) are compiled a few
sources to a TU (CMake's UNITY_BUILD, see Note [Unity build] in CMakeLists.txt). Two sources with the same internal name would then share one
TU: most such pairs fail to compile (a redefinition), but two overloads of different parameter types
compile, and a call in the second file may silently pick the first file's. So each internal name
must belong to one source. This parses only what it needs (comments, strings and preprocessor lines
dropped; braces counted), names each finding FILE:LINE, and exits 1 on any.
Usage: check_unity.py [REPO_ROOT]."""
import os
import re
import sys
from collections import defaultdict

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))


# (the CMakeLists.txt that declares it, the target): each compiled as a unity build.
UNITY_TARGETS = [("CMakeLists.txt", "cpprun_dist"), ("launcher/CMakeLists.txt", "cpprun_launcher_core"),
                 ("tests/CMakeLists.txt", "cpprun_unit_tests"), ("tests/CMakeLists.txt", "cpprun_dist_comm"),
                 ("tests/CMakeLists.txt", "cpprun_dist_collectives")]


def target_sources(cmake_file, target):
    """The target's .cpp files, relative to the repository root."""
    text = open(os.path.join(root, cmake_file)).read()
    text = re.sub(r"#[^\n]*", "", text)
    block = re.search(r"(?:add_library|add_executable|cpprun_test_binary)\(" + target + r"\b(.*?)\)", text, re.S)
    if not block:
        sys.exit(f"check_unity: {cmake_file} declares no target {target}")
    folder = os.path.dirname(cmake_file)
    sources = []
    for item in block.group(1).split():
        if not item.endswith(".cpp"):
            continue
        item = item.replace("${PROJECT_SOURCE_DIR}/", "/")
        sources.append(item[1:] if item.startswith("/") else os.path.join(folder, item))
    return sources


def blank_out(src):
    """The source with comments, string/char literals and preprocessor lines replaced by spaces
    (newlines kept, so offsets still give line numbers)."""
    out = list(src)
    i, n = 0, len(src)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    at_line_start = True
    while i < n:
        c = src[i]
        if at_line_start and c == "#":
            j = i
            while j < n and (src[j] != "\n" or src[j - 1] == "\\"):
                j += 1
            blank(i, j)
            i = j
            continue
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == "R" and src.startswith('R"', i) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', src[i:])
            end = src.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            blank(i, j)
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and src[i - 1].isalnum():  # a digit separator: 1'000
                i += 1
                continue
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


IDENT = r"[A-Za-z_]\w*"


def without_raw_strings(src):
    """The source with the text of each raw string literal (R"x(...)x") blanked, newlines kept: a
    kernel's source held in one is not this file's preprocessor."""
    out, i = [], 0
    for m in re.finditer(r'(?<![\w])R"([^(\s]*)\(', src):
        if m.start() < i:
            continue
        end = src.find(")" + m.group(1) + '"', m.end())
        end = len(src) if end < 0 else end
        out.append(src[i:m.end()])
        out.append(re.sub(r"[^\n]", " ", src[m.end():end]))
        i = end
    out.append(src[i:])
    return "".join(out)


def declared_name(statement):
    """The name a namespace-scope declaration introduces, or None."""
    s = re.sub(r"template\s*<[^;{]*?>\s*", "", statement.strip())
    m = re.match(r"(?:\w+\s+)*?(?:struct|class|union|enum(?:\s+class|\s+struct)?)\s+(" + IDENT + ")", s)
    if m:
        return m.group(1)
    m = re.match(r"using\s+(" + IDENT + r")\s*=", s)
    if m:
        return m.group(1)
    m = re.search(r"(operator\s*\S+?|" + IDENT + r")\s*[(\[={]", s)
    return m.group(1) if m else None


def internal_names(path, everything=False):
    """(enclosing named namespaces, name, line, how) for each internal-linkage declaration, and
    (line, text) for each namespace-scope `using namespace` or macro left defined at the end.
    everything: every namespace-scope declaration, not only the internal ones (for headers)."""
    raw = open(path).read()
    text = blank_out(raw)
    names, usings = [], []
    defined = {}
    for number, line in enumerate(without_raw_strings(raw).splitlines(), 1):
        m = re.match(r"\s*#\s*(define|undef)\s+(" + IDENT + ")", line)
        if m and m.group(1) == "define":
            defined[m.group(2)] = number
        elif m:
            defined.pop(m.group(2), None)
    for macro, number in defined.items():
        usings.append((number, f"#define {macro}"))
    stack = []  # one entry per open brace: ('ns', name) | ('anon', None) | ('body', None)
    statement, start = "", 0
    i, n = 0, len(text)

    def named_path():
        return "::".join(name for kind, name in stack if kind == "ns")

    def at_namespace_scope():
        return all(kind != "body" for kind, _ in stack)

    while i < n:
        c = text[i]
        if not at_namespace_scope():
            if c == "{":
                stack.append(("body", None))
            elif c == "}":
                _, initializer = stack.pop()
                if at_namespace_scope() and not initializer:
                    statement = ""  # a function's or a class's body ends its declaration
            i += 1
            continue
        if c == "{":
            m = re.fullmatch(r"\s*(?:inline\s+)?namespace\s*(" + IDENT + r"(?:::" + IDENT + r")*)?\s*", statement)
            if m:
                stack.append(("ns", m.group(1)) if m.group(1) else ("anon", None))
                statement = ""
            else:
                record(names, stack, statement, start, text, named_path(), everything)
                # `x = {...}` or `= [] {...}` goes on to its ';'; a function's body (its default
                # arguments' '=' are inside parentheses) or a class's ends the declaration.
                outside_parentheses = statement
                while re.search(r"\([^()]*\)", outside_parentheses):
                    outside_parentheses = re.sub(r"\([^()]*\)", "", outside_parentheses)
                stack.append(("body", "=" in outside_parentheses))
            i += 1
            continue
        if c == "}":
            stack.pop()
            statement = ""
            i += 1
            continue
        if c == ";":
            # std's literal namespaces bring only suffixes (5s, "x"sv), which no call can mistake.
            if re.match(r"\s*using\s+namespace\b", statement) and \
               not re.fullmatch(r"\s*using\s+namespace\s+std::(\w+_)?literals(::\w+)?\s*", statement):
                usings.append((text.count("\n", 0, start) + 1, " ".join(statement.split())))
            record(names, stack, statement, start, text, named_path(), everything)
            statement = ""
            i += 1
            continue
        if not statement.strip() and not c.isspace():
            start = i
        statement += c
        i += 1
    # A declaration is recorded at its first '{' or ';': the same one may be seen twice (a struct's
    # body then its ';'), so keep one per line.
    return list(dict.fromkeys(names)), usings


def record(names, stack, statement, start, text, named, everything=False):
    if not statement.strip() or statement.strip().startswith(("using namespace", "friend", "static_assert")):
        return
    if re.match(r"\s*[A-Z_][A-Z0-9_]*\s*\(", statement):  # a macro's use, e.g. TORCH_MODULE(Block)
        return
    anonymous = bool(stack) and stack[-1][0] == "anon"
    static = re.match(r"\s*static\b", statement) is not None
    if not (anonymous or static or everything):
        return
    # An alias (`using T = ...;`, `namespace fs = ...;`) may repeat in several sources when it names
    # the same thing each time: in one TU that is a legal redeclaration, nothing a call can mistake.
    alias = re.fullmatch(r"\s*(?:using|namespace)\s+(" + IDENT + r")\s*=\s*(.*?)\s*", statement, re.S)
    name = alias.group(1) if alias else declared_name(statement)
    if name:
        how = ("alias of " + " ".join(alias.group(2).split())) if alias else \
              ("anonymous namespace" if anonymous else "static" if static else "declared")
        names.append((named, name, text.count("\n", 0, start) + 1, how))


# Where the project's own headers live: an internal name must not repeat a name one of them declares.
HEADER_FOLDERS = ["include", "comm", "core", "ddp", "fsdp", "tp", "pipeline", "training", "checkpoint", "nn",
                  "sampler", "support", "launcher", "tests"]


def header_declarations():
    """(namespace, name) -> [(header, line, how)] for every namespace-scope declaration of a header."""
    declared = defaultdict(list)
    for folder in HEADER_FOLDERS:
        for base, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if name.endswith(".h"):
                    path = os.path.join(base, name)
                    for namespace, declared_as, line, how in internal_names(path, everything=True)[0]:
                        declared[(namespace, declared_as)].append((os.path.relpath(path, root), line, how))
    return declared


def main():
    problems, counted_sources, counted_names = [], 0, 0
    global HEADERS
    HEADERS = header_declarations()
    for cmake_file, target in UNITY_TARGETS:
        sources = target_sources(cmake_file, target)
        counted_sources += len(sources)
        counted_names += check_target(target, sources, problems)
    print(f"check_unity: {counted_sources} sources of {len(UNITY_TARGETS)} unity targets, {counted_names} internal names")
    for p in problems:
        print("check_unity: " + p)
    if problems:
        print(f"check_unity: FAIL: {len(problems)} problem(s) above")
        return 1
    print("check_unity: every internal name belongs to one source of its target; no namespace-scope 'using namespace', no macro left defined")
    return 0


def check_target(target, sources, problems):
    seen = defaultdict(list)  # (namespace, name) -> [(file, line, how)]
    for rel in sources:
        names, usings = internal_names(os.path.join(root, rel))
        for namespace, name, line, how in names:
            seen[(namespace, name)].append((rel, line, how))
        for line, what in usings:
            if what.startswith("#define"):
                problems.append(f"{rel}:{line}: '{what}' is still defined at the end of the file, so it would reach "
                                "the sources after it in its unity TU: #undef it there")
            else:
                problems.append(f"{rel}:{line}: '{what}' at namespace scope would reach the sources after it in "
                                "its unity TU: qualify the names, or put it inside a function")
    for (namespace, name), where in sorted(seen.items()):
        f, l, _ = where[0]
        own = re.findall(r'^\s*#\s*include\s*"([^"]+)"', open(os.path.join(root, f)).read(), re.M)
        for header, line, how in HEADERS.get((namespace, name), []):
            if how == where[0][2] and how.startswith("alias of "):
                continue
            if len(files) == 1 and any(header.endswith(i) for i in own):
                continue  # the source includes it: the two meet there without a unity build too
            problems.append(f"'{namespace + '::' if namespace else ''}{name}' has internal linkage in {f}:{l} and is "
                            f"declared by {header}:{line}: in a unity TU where a neighbour includes that header, a "
                            "call may reach either; rename the internal one, or use the header's")
        files = sorted({f for f, _, _ in where})
        same_alias = len({how for _, _, how in where}) == 1 and where[0][2].startswith("alias of ")
        if len(files) > 1 and not same_alias:
            places = ", ".join(f"{f}:{line} ({how})" for f, line, how in where)
            problems.append(f"'{namespace + '::' if namespace else ''}{name}' has internal linkage in {len(files)} "
                            f"sources of {target} ({places}): in one unity TU a call may reach the other's; "
                            "rename one, or move a shared helper to a header")
    return len(seen)


if __name__ == "__main__":
    sys.exit(main())
