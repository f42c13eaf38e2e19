"""Compares two backends' runs of PyTorch's suite from run.sh's JUnit files.

    python tests/conformance/compare.py build/conformance/full-gloo-2.xml \
        build/conformance/full-ddl-2.xml [--list]

Prints each run's counts (passed / failed / skipped), the tests that pass with the first backend
and not with the second, and the second backend's skip reasons with how many tests each covers
(and, with --list, which).
"""

import collections
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    """{test name: (outcome, reason)} for one JUnit file."""
    result = {}
    for case in ET.parse(path).iter("testcase"):
        outcome, reason = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, reason = "failed", (child.get("message") or "")[:160]
            elif child.tag == "skipped":
                outcome, reason = "skipped", child.get("message") or ""
        result[case.get("name")] = (outcome, reason)
    return result


def counts(result):
    c = collections.Counter(outcome for outcome, _ in result.values())
    return f"{c['passed']} passed / {c['failed']} failed / {c['skipped']} skipped ({len(result)})"


def main(reference_path, candidate_path, list_tests=False):
    reference, candidate = outcomes(reference_path), outcomes(candidate_path)
    print(f"{reference_path}: {counts(reference)}")
    print(f"{candidate_path}: {counts(candidate)}")
    missing = sorted(name for name, (outcome, _) in reference.items()
                     if outcome == "passed" and candidate.get(name, ("absent",))[0] != "passed")
    print(f"\npass in the first run, not in the second: {len(missing)}")
    for name in missing:
        outcome, reason = candidate.get(name, ("absent", ""))
        print(f"  {name}: {outcome} {reason}")
    skipped = collections.defaultdict(list)
    for name, (outcome, reason) in sorted(candidate.items()):
        if outcome == "skipped":
            skipped[reason].append(name)
    print(f"\nskip reasons in the second run: {len(skipped)}")
    for reason, names in sorted(skipped.items(), key=lambda item: -len(item[1])):
        print(f"  {len(names):4d}  {reason}")
        if list_tests:
            print("\n".join(f"          {name}" for name in names))
    return 1 if missing else 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--list"]
    if len(args) != 2:
        sys.exit(__doc__)
    sys.exit(main(args[0], args[1], list_tests="--list" in sys.argv))
