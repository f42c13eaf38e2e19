"""The layers of csrc/, checked: every quoted include points to the file's own layer or one below
it, and no source file is longer than 600 lines. docs/internals.md draws the same order.

    python tools/check_layers.py        # prints each breach; exit status 1 if there is one
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Bottom up. Folders on one line are one layer: they may not include each other.
LAYERS = [
    ["core/base"],
    ["core/topology", "core/transport", "core/reduce"],
    ["core/memory"],
    ["core/runtime"],
    ["core/shm"],
    ["core/algorithms"],
    ["core/group"],
    ["core/sim"],
    ["cuda"],
    ["torch"],
]
MAX_LINES = 600
SOURCES = (".h", ".hpp", ".cc", ".cpp", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path, root=ROOT):
    """The layer folder a file of csrc/ belongs to ('core/transport/ucx/x.cc' -> 'core/transport')."""
    rel = os.path.relpath(path, os.path.join(root, "csrc")).replace(os.sep, "/")
    for level in LAYERS:
        for folder in level:
            if rel == folder or rel.startswith(folder + "/"):
                return folder
    return None


def rank_of(folder):
    for i, level in enumerate(LAYERS):
        if folder in level:
            return i
    return None


def breaches(root=ROOT):
    """Every include that runs up a layer and every file over MAX_LINES under root/csrc."""
    found = []
    for directory, _, names in os.walk(os.path.join(root, "csrc")):
        for name in sorted(names):
            if not name.endswith(SOURCES):
                continue
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            text = open(path).read()
            lines = text.count("\n")
            if lines > MAX_LINES:
                found.append(f"{rel}: {lines} lines (at most {MAX_LINES})")
            mine = folder_of(path, root)
            if mine is None:
                found.append(f"{rel}: in no layer of tools/check_layers.py")
                continue
            for included in INCLUDE.findall(text):
                target = os.path.normpath(os.path.join(directory, included))
                theirs = folder_of(target, root)
                if theirs is None or not target.startswith(os.path.join(root, "csrc")):
                    continue
                if theirs == mine:
                    continue
                if rank_of(theirs) >= rank_of(mine):
                    found.append(f"{rel}: includes {included} ({theirs} is not below {mine})")
    return found


def main():
    found = breaches()
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
