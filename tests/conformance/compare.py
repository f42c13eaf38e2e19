"""Compares two backends' runs of PyTorch's suite from run.sh's JUnit files.

    python tests/conformance/compare.py build/conformance/full-gloo-2.xml \
        build/conformance/full-ddl-2.xml

Prints each run's counts (passed / failed / skipped), the tests that pass with the first backend
and not with the second, and the second backend's skip reasons with how many tests each covers.
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


def main(reference_path, candidate_path):
    reference, candidate = outcomes(reference_path), outcomes(candidate_path)
    print(f"{reference_path}: {counts(reference)}")
    print(f"{candidate_path}: {counts(candidate)}")
    missing = sorted(name for name, (outcome, _) in reference.items()
                     if outcome == "passed" and candidate.get(name, ("absent",))[0] != "passed")
    print(f"\npass in the first run, not in the second: {len(missing)}")
    for name in missing:
        outcome, reason = candidate.get(name, ("absent", ""))
        print(f"  {name}: {outcome} {reason}")
    reasons = collections.Counter(reason for outcome, reason in candidate.values()
                                  if outcome == "skipped")
    print(f"\nskip reasons in the second run: {len(reasons)}")
    for reason, n in reasons.most_common():
        print(f"  {n:4d}  {reason}")
    return 1 if missing else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
