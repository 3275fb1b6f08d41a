#!/usr/bin/env python3
"""Checks that the program in README.md's "A training program" section (its first ```cpp block) is
examples/readme_train.cpp, character for character, so that the program the README shows is the one
the tests build and run (example.readme_train.np2). Prints a diff and exits 1 where they differ.
Usage: check_readme_example.py [REPO_ROOT]."""
import difflib
import os
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
SECTION, EXAMPLE = "## A training program", "examples/readme_train.cpp"


def readme_program(text):
    """The lines of the section's first ```cpp block, or None where there is none."""
    lines = text.splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if line.rstrip() == SECTION)
    except StopIteration:
        return None
    block = None
    for line in lines[start + 1:]:
        if block is None and line.startswith("## "):
            return None  # the next section: no program in this one
        if block is None and line.rstrip() == "```cpp":
            block = []
        elif block is not None and line.rstrip() == "```":
            return block
        elif block is not None:
            block.append(line)
    return None


def main():
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        shown = readme_program(f.read())
    if shown is None:
        print(f"README.md has no ```cpp block under \"{SECTION}\": the check cannot find the program it shows.")
        return 1
    with open(os.path.join(root, EXAMPLE), encoding="utf-8") as f:
        built = f.read().splitlines(keepends=True)
    if shown == built:
        print(f"README.md's \"{SECTION[3:]}\" is {EXAMPLE} ({len(built)} lines)")
        return 0
    sys.stdout.writelines(difflib.unified_diff(shown, built, "README.md (A training program)", EXAMPLE))
    print(f"\nFAIL: README.md's program and {EXAMPLE} differ (above); make them the same: the tests build "
          f"and run {EXAMPLE}, so the README shows what was tested.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
