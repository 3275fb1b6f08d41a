#!/usr/bin/env python3
"""Checks that the library's sources are safe to compile as a unity build: no two of them give the
same name internal linkage (an anonymous namespace's or a namespace-scope `static`'s), and none has
a `using namespace` at namespace scope.

The library (`cpprun_dist`) is compiled a few sources to a TU (CMake's UNITY_BUILD, see
Note [Unity build] in CMakeLists.txt). Two sources with the same internal name would then share one
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


def library_sources():
    text = open(os.path.join(root, "CMakeLists.txt")).read()
    block = re.search(r"add_library\(cpprun_dist\b(.*?)\)", text, re.S)
    if not block:
        sys.exit("check_unity: no add_library(cpprun_dist ...) in CMakeLists.txt")
    return [s for s in block.group(1).split() if s.endswith(".cpp")]


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


def internal_names(path):
    """(enclosing named namespaces, name, line, how) for each internal-linkage declaration, and
    (line, text) for each namespace-scope `using namespace`."""
    text = blank_out(open(path).read())
    names, usings = [], []
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
                stack.pop()
                if at_namespace_scope() and "(" in statement and "=" not in statement:
                    statement = ""  # the end of a function's body ends its declaration
            i += 1
            continue
        if c == "{":
            m = re.fullmatch(r"\s*(?:inline\s+)?namespace\s*(" + IDENT + r"(?:::" + IDENT + r")*)?\s*", statement)
            if m:
                stack.append(("ns", m.group(1)) if m.group(1) else ("anon", None))
                statement = ""
            else:
                record(names, stack, statement, start, text, named_path())
                stack.append(("body", None))
            i += 1
            continue
        if c == "}":
            stack.pop()
            statement = ""
            i += 1
            continue
        if c == ";":
            if re.match(r"\s*using\s+namespace\b", statement):
                usings.append((text.count("\n", 0, start) + 1, " ".join(statement.split())))
            record(names, stack, statement, start, text, named_path())
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


def record(names, stack, statement, start, text, named):
    if not statement.strip() or statement.strip().startswith(("using namespace", "friend", "static_assert")):
        return
    anonymous = bool(stack) and stack[-1][0] == "anon"
    static = re.match(r"\s*static\b", statement) is not None
    if not (anonymous or static):
        return
    # An alias (`using T = ...;`, `namespace fs = ...;`) may repeat in several sources when it names
    # the same thing each time: in one TU that is a legal redeclaration, nothing a call can mistake.
    alias = re.fullmatch(r"\s*(?:using|namespace)\s+(" + IDENT + r")\s*=\s*(.*?)\s*", statement, re.S)
    name = alias.group(1) if alias else declared_name(statement)
    if name:
        how = ("alias of " + " ".join(alias.group(2).split())) if alias else \
              ("anonymous namespace" if anonymous else "static")
        names.append((named, name, text.count("\n", 0, start) + 1, how))


def main():
    sources = library_sources()
    seen = defaultdict(list)  # (namespace, name) -> [(file, line, how)]
    problems = []
    for rel in sources:
        names, usings = internal_names(os.path.join(root, rel))
        for namespace, name, line, how in names:
            seen[(namespace, name)].append((rel, line, how))
        for line, what in usings:
            problems.append(f"{rel}:{line}: '{what}' at namespace scope would reach the sources after it in "
                            "its unity TU: qualify the names, or put it inside a function")
    for (namespace, name), where in sorted(seen.items()):
        files = sorted({f for f, _, _ in where})
        same_alias = len({how for _, _, how in where}) == 1 and where[0][2].startswith("alias of ")
        if len(files) > 1 and not same_alias:
            places = ", ".join(f"{f}:{line} ({how})" for f, line, how in where)
            problems.append(f"'{namespace + '::' if namespace else ''}{name}' has internal linkage in {len(files)} "
                            f"library sources ({places}): in one unity TU a call may reach the other's; "
                            "rename one, or move a shared helper to a header")
    print(f"check_unity: {len(sources)} library sources, {len(seen)} internal names")
    for p in problems:
        print("check_unity: " + p)
    if problems:
        print(f"check_unity: FAIL: {len(problems)} problem(s) above")
        return 1
    print("check_unity: every internal name belongs to one source; no namespace-scope 'using namespace'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
