#!/usr/bin/env python3
"""Checks that every relative link in README.md and docs/*.md resolves: the file exists and, for
`file.md#anchor` or `#anchor`, the file has a heading with that anchor (GitHub's rule: lower case,
punctuation but `-` and `_` dropped, spaces to `-`, `-1`, `-2` ... for repeats). Prints each broken
link with its file and line; exit 1 if there is one. Usage: check_doc_links.py [REPO_ROOT]."""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    found, seen, fence = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        match = None if fence else re.match(r"^#{1,6} (.*)", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def main():
    pages = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        pages += sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))
    broken = 0
    for page in pages:
        fence = False
        for number, line in enumerate(open(page, encoding="utf-8"), 1):
            if line.startswith("```"):
                fence = not fence
            if fence:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                path = os.path.normpath(os.path.join(os.path.dirname(page), file_part)) if file_part else page
                problem = None
                if not os.path.exists(path):
                    problem = "no such file"
                elif anchor and path.endswith(".md") and anchor not in anchors(path):
                    problem = f"no heading with anchor #{anchor} in {os.path.relpath(path, root)}"
                if problem:
                    broken += 1
                    print(f"{os.path.relpath(page, root)}:{number}: ({target}): {problem}")
    print(f"check_doc_links: {len(pages)} pages, {broken} broken link(s)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
