"""The layers of csrc/, checked: every quoted include points to the file's own layer or one below it,
no source file is longer than 600 lines, no function longer than 80 (but the few listed in
LONG_FUNCTIONS, a list that may only shrink), and no comment names a file that does not exist (one
that moved or is gone), nor does a document (README.md, SECURITY.md, docs/) in backquotes.
docs/internals.md draws the same order.

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
MAX_FUNCTION_LINES = 80
# Functions still longer, each at most as long as it is now: split one and take it off.
LONG_FUNCTIONS = {}
SOURCES = (".h", ".hpp", ".cc", ".cpp", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# A file named in a comment: "shm/shared_ring.h", "ring_pipeline.h", "benchmarks/x.py".
NAMED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:h|hpp|cc|cpp|cu|py|md|sh|txt))\b")
SKIPPED = {".git", ".venv", "build", "node_modules"}


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


def sources(root):
    """(folder, path) of every source file under root/csrc."""
    for directory, _, names in os.walk(os.path.join(root, "csrc")):
        for name in sorted(names):
            if name.endswith(SOURCES):
                yield directory, os.path.join(directory, name)


def breaches(root=ROOT):
    """Every include that runs up a layer and every file over MAX_LINES under root/csrc."""
    found = []
    for directory, path in sources(root):
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


def functions(text):
    """(name, first line, lines) of each function defined at the top level of a C++ file (in
    clang-format's Google style: its signature starts in column 0, its body ends with a "}" there)."""
    lines = text.split("\n")
    found = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if (line and not line[0].isspace() and "(" in line and not line.startswith(("//", "#", "}"))
                and not re.match(r"(namespace|class|struct|enum|union|using|extern|static_assert)\b",
                                 line)):
            end = i
            while end < len(lines) and end - i < 8 and not lines[end].rstrip().endswith(("{", ";")):
                end += 1
            if end < len(lines) and lines[end].rstrip().endswith("{") and "=" not in line.split("(")[0]:
                close = end + 1
                while close < len(lines) and not lines[close].startswith("}"):
                    close += 1
                if close < len(lines) and lines[close].rstrip() == "}":
                    name = re.findall(r"([\w:~]+)\s*\(", line)
                    found.append((name[0] if name else line[:40], i + 1, close - i + 1))
                    i = close
        i += 1
    return found


def long_functions(root=ROOT, allowed=None):
    """Every function over MAX_FUNCTION_LINES not in `allowed` (LONG_FUNCTIONS), or longer than it
    allows, and every entry of `allowed` that no longer needs to be there."""
    allowed = LONG_FUNCTIONS if allowed is None else allowed
    found, seen = [], set()
    for _, path in sources(root):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        for function, first, length in functions(open(path).read()):
            key = f"{rel} {function}"
            if length <= MAX_FUNCTION_LINES:
                continue
            seen.add(key)
            if length > allowed.get(key, MAX_FUNCTION_LINES):
                found.append(f"{rel}:{first}: {function} is {length} lines (at most "
                             f"{allowed.get(key, MAX_FUNCTION_LINES)})")
    for key in sorted(set(allowed) - seen):
        found.append(f"{key}: listed in LONG_FUNCTIONS, and no longer over "
                     f"{MAX_FUNCTION_LINES} lines: take it off")
    return found


def stale_names(root=ROOT):
    """Every file a comment under root/csrc names that does not exist. A path is looked for from
    the file's folder, csrc/, csrc/core/ and the root; a bare name anywhere in the tree."""
    names = set()
    for directory, folders, files in os.walk(root):
        folders[:] = [f for f in folders if f not in SKIPPED]
        names.update(files)
    found = []
    for directory, path in sources(root):
        bases = [directory, os.path.join(root, "csrc"), os.path.join(root, "csrc", "core"), root]
        for number, line in enumerate(open(path), 1):
            comment = line.find("//")
            if comment < 0:
                continue
            for named in NAMED.findall(line[comment:]):
                if "/" not in named and named in names:
                    continue
                found += gone(root, path, number, named, bases)
    return found


def gone(root, path, number, named, bases):
    """[the breach] if `named` (on line `number` of `path`) is found from none of `bases`."""
    if any(os.path.exists(os.path.join(b, named)) for b in bases):
        return []
    return [f"{os.path.relpath(path, root)}:{number}: names {named}, which does not exist"]


QUOTED = re.compile(r"`([^`\s]+)`")


def stale_doc_names(root=ROOT):
    """Every file of this tree that the README, SECURITY.md or docs/ name in backquotes and that
    does not exist: a path whose first folder is one of the root's or of csrc/core's, looked for
    from the root, csrc/ and csrc/core/ (a path of another project's, include/ucp/api/ucp.h, is
    left alone; so is build/, made by the build)."""
    core = os.path.join(root, "csrc", "core")
    ours = set()
    for base in (root, core):
        if os.path.isdir(base):
            ours.update(f for f in os.listdir(base) if os.path.isdir(os.path.join(base, f)))
    ours -= {"build", ".git", ".venv"}
    documents = [os.path.join(root, name) for name in ("README.md", "SECURITY.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        documents += [os.path.join(docs, f) for f in sorted(os.listdir(docs)) if f.endswith(".md")]
    bases = [root, os.path.join(root, "csrc"), core]
    found = []
    for path in documents:
        if not os.path.exists(path):
            continue
        for number, line in enumerate(open(path), 1):
            for quoted in QUOTED.findall(line):
                for named in NAMED.findall(quoted):
                    if "/" in named and named.split("/")[0] in ours:
                        found += gone(root, path, number, named, bases)
    return found


def main():
    found = breaches() + long_functions() + stale_names() + stale_doc_names()
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
