"""The layers of csrc/ (docs/internals.md): no include runs from a lower layer to a higher one,
no source file is longer than 600 lines, and no comment names a file that does not exist
(tools/check_layers.py)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import check_layers  # noqa: E402


def test_every_include_points_down_and_every_file_is_short():
    assert check_layers.breaches() == []


def test_the_check_finds_an_include_that_runs_up_and_a_file_too_long(tmp_path):
    runtime = tmp_path / "csrc" / "core" / "runtime"
    group = tmp_path / "csrc" / "core" / "group"
    runtime.mkdir(parents=True)
    group.mkdir(parents=True)
    (group / "engine.h").write_text("#pragma once\n")
    (runtime / "op.cc").write_text('#include "../group/engine.h"\n#include "op.h"\n')
    (runtime / "op.h").write_text("#pragma once\n" + "// line\n" * 601)
    found = check_layers.breaches(str(tmp_path))
    assert any("runtime/op.cc: includes ../group/engine.h" in f for f in found), found
    assert any("runtime/op.h: 602 lines" in f for f in found), found
    assert len(found) == 2, found


def test_no_comment_names_a_file_that_is_gone():
    assert check_layers.stale_names() == []


def test_no_document_names_a_file_that_is_gone():
    assert check_layers.stale_doc_names() == []


def test_the_check_finds_a_document_naming_a_file_that_moved(tmp_path):
    (tmp_path / "csrc" / "core" / "algorithms").mkdir(parents=True)
    (tmp_path / "csrc" / "core" / "shm").mkdir(parents=True)
    (tmp_path / "csrc" / "core" / "algorithms" / "slot_link.h").write_text("#pragma once\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "internals.md").write_text(
        "The slots (`algorithms/slot_link.h`), once `shm/slot_link.h`;\n"
        "UCX's `include/ucp/api/ucp.h` is another project's.\n")
    found = check_layers.stale_doc_names(str(tmp_path))
    assert found == ["docs/internals.md:1: names shm/slot_link.h, which does not exist"], found


def test_the_check_finds_a_comment_naming_a_file_that_moved(tmp_path):
    shm = tmp_path / "csrc" / "core" / "shm"
    algorithms = tmp_path / "csrc" / "core" / "algorithms"
    shm.mkdir(parents=True)
    algorithms.mkdir(parents=True)
    (algorithms / "slot_link.h").write_text("#pragma once\n")
    (shm / "ring.h").write_text(
        "// over a SlotLink (shm/slot_link.h), see slot_link.h and algorithms/slot_link.h;\n"
        "// agreed as derive.h says\n")
    found = check_layers.stale_names(str(tmp_path))
    assert found == ["csrc/core/shm/ring.h:1: names shm/slot_link.h, which does not exist",
                     "csrc/core/shm/ring.h:2: names derive.h, which does not exist"], found


def test_the_check_finds_a_long_function_and_an_entry_no_longer_needed(tmp_path):
    core = tmp_path / "csrc" / "core" / "base"
    core.mkdir(parents=True)
    body = "".join(f"  x += {i};\n" for i in range(85))
    (core / "a.cc").write_text(f"int longOne(int x) {{\n{body}  return x;\n}}\n\n"
                               "int shortOne(int x) {\n  return x;\n}\n")
    found = check_layers.long_functions(str(tmp_path), allowed={})
    assert found == ["csrc/core/base/a.cc:1: longOne is 88 lines (at most 80)"], found
    assert check_layers.long_functions(str(tmp_path), allowed={"csrc/core/base/a.cc longOne": 88}) == []
    found = check_layers.long_functions(str(tmp_path), allowed={"csrc/core/base/a.cc shortOne": 90})
    assert "csrc/core/base/a.cc shortOne: listed in LONG_FUNCTIONS" in found[-1], found


def test_no_function_is_longer_than_80_lines():
    assert check_layers.long_functions() == []
    assert check_layers.LONG_FUNCTIONS == {}  # none left: a new long function is split, not listed
