"""The layers of csrc/ (docs/internals.md): no include runs from a lower layer to a higher one,
and no source file is longer than 600 lines (tools/check_layers.py)."""

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
