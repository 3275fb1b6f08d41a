#!/usr/bin/env python3
"""Reads what a ctest run left and fails it for what ctest itself lets pass.

ctest exits 0 when a test skips (SKIP_RETURN_CODE 77): a test that could not run here would pass
CI unseen. Only tests labelled `gpu` may skip on a machine without a GPU; any other skipped test
fails the run here, named with the reason it printed ("SKIP: ..."). Also fails when the run
executed no test at all (an empty -R/-L filter).

usage: ctest_verdict.py BUILD_DIR JUNIT_XML [--allow-skip REGEX]
  JUNIT_XML      what `ctest --output-junit` wrote
  --allow-skip   also accept skips of the tests whose names match REGEX (a developer without
                 root, say); scripts/test.sh never passes it, so CI never does
Prints one line per skip and a closing "N passed, N failed, N skipped" line.
"""
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET


def labels_by_test(build_dir):
    """{test name: set of labels}, from ctest's own JSON description of the tests."""
    shown = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1"],
                           check=True, capture_output=True, text=True).stdout
    labels = {}
    for test in json.loads(shown).get("tests", []):
        names = set()
        for prop in test.get("properties", []):
            if prop.get("name") == "LABELS":
                names.update(prop.get("value", []))
        labels[test["name"]] = names
    return labels


def skip_reason(case):
    """The test's own "SKIP: ..." line, or what ctest said."""
    out = case.findtext("system-out") or ""
    lines = [line.strip() for line in out.splitlines() if "SKIP" in line]
    if lines:
        return lines[-1]
    skipped = case.find("skipped")
    return (skipped.get("message") if skipped is not None else None) or "no reason printed"


def main(argv):
    if len(argv) not in (3, 5) or (len(argv) == 5 and argv[3] != "--allow-skip"):
        print(__doc__, file=sys.stderr)
        return 2
    build_dir, junit = argv[1], argv[2]
    allowed = re.compile(argv[4]) if len(argv) == 5 else None
    labels = labels_by_test(build_dir)
    passed = failed = skipped = 0
    refused = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name")
        status = case.get("status")
        if status == "run":
            passed += 1
        elif status == "fail":
            failed += 1
        else:  # notrun / disabled: SKIP_RETURN_CODE, a missing executable, or DISABLED
            skipped += 1
            reason = skip_reason(case)
            may_skip = "gpu" in labels.get(name, set()) or (allowed and allowed.search(name))
            print(f"ctest_verdict: {name} skipped{'' if may_skip else ' (not allowed here)'}: {reason}")
            if not may_skip:
                refused.append(name)
    print(f"ctest_verdict: {passed} passed, {failed} failed, {skipped} skipped")
    if passed + failed == 0:
        print("ctest_verdict: no test ran: the filter matched nothing", file=sys.stderr)
        return 1
    if refused:
        print(f"ctest_verdict: {len(refused)} test(s) that must run on this machine were skipped: "
              f"{' '.join(refused)}. Each line above says why (e.g. not root, a missing Python "
              f"module: run scripts/setup.sh). Only tests labelled gpu may skip.", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
