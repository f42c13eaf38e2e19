"""python -m torch_ddl.sim: the simulated cluster's command line (the C++ suite tests the
simulator itself at 64 - 512 ranks)."""

import re

from ddl_testing import sim_command as sim

SIM_LINE = re.compile(
    r"SIM ranks=(\d+) algo=(\S+) bytes=(\d+) sim_us=([\d.]+) model_us=([\d.]+) "
    r"store_requests=(\d+) max_endpoints=(\d+) messages=(\d+) op_messages=(\d+) "
    r"creation_us=([\d.]+) wall_s=([\d.]+)$")


def test_a_run_prints_its_figures_last_and_checks_every_result():
    code, lines, err = sim("--ranks", "64", "--ranks-per-host", "4", "--hosts-per-rack", "4",
                           "--bytes", "64K")
    assert code == 0, err
    match = SIM_LINE.match(lines[-1])
    assert match, lines
    ranks, algo, size = int(match[1]), match[2], int(match[3])
    assert (ranks, size) == (64, 65536)
    assert float(match[4]) > 0 and float(match[5]) > 0
    assert int(match[6]) <= 10 * ranks  # store requests
    assert int(match[7]) <= 64  # endpoints
    assert 0 < int(match[9]) < int(match[8])  # the op's messages, of every message of the run
    assert float(match[10]) > 0  # creation's virtual time
    assert "CHECK payload=ok" in lines


def test_one_seed_gives_one_line():
    runs = [sim("--ranks", "128", "--bytes", "1M", "--algo", "multidim", "--seed", "3")
            for _ in range(2)]
    assert all(code == 0 for code, _, _ in runs)
    (_, a, _), (_, b, _) = runs
    without_wall = [re.sub(r" wall_s=\S+", "", lines[-1]) for lines in (a, b)]
    assert without_wall[0] == without_wall[1]
    assert [l for l in a if l.startswith("TRACE")] == [l for l in b if l.startswith("TRACE")]


def test_every_forced_algorithm_and_collective_runs():
    for algo in ["ring", "multidim", "leaders", "recursive_doubling"]:
        code, lines, err = sim("--ranks", "64", "--bytes", "4K", "--algo", algo)
        assert code == 0, err
        assert "CHECK payload=ok" in lines, (algo, lines)
    code, lines, err = sim("--hosts", "4,3,4,1,4", "--bytes", "12K", "--collective", "allgather")
    assert code == 0, err
    match = SIM_LINE.match(lines[-1])
    assert "CHECK payload=ok" in lines and match[1] == "16"
    assert match[2].startswith("allgather:") and float(match[5]) > 0  # the schedule, its price


def test_a_killed_rank_is_named_by_every_survivor():
    code, lines, err = sim("--ranks", "64", "--bytes", "1M", "--kill", "17@0.5")
    assert code == 0, err
    kill = [l for l in lines if l.startswith("KILL")]
    assert kill and re.match(r"KILL ranks=17 named=63 of 63 by_us=[\d.]+ failure_messages=\d+",
                             kill[0]), lines
    assert SIM_LINE.match(lines[-1])


def test_the_survivors_shrink_into_one_group_whose_next_collectives_are_right():
    code, lines, err = sim("--ranks", "64", "--ranks-per-host", "4", "--bytes", "1M",
                           "--kill", "5@0.5", "--shrink")
    assert code == 0, (err, lines)
    shrink = [l for l in lines if l.startswith("SHRINK")]
    assert shrink and re.match(r"SHRINK groups=1 members=63 took_us=[\d.]+ messages=(\d+) "
                               r"ops_ok=20 of 20 checked=20$", shrink[0]), lines
    # The agreement's messages: at least one a member, and fewer than one from each member to
    # every other.
    messages = int(re.search(r"messages=(\d+)", shrink[0]).group(1))
    assert 63 <= messages <= 63 * 64, shrink[0]
    assert lines.index(shrink[0]) == len(lines) - 2  # just before the SIM line


def test_progress_tells_each_stage_of_a_long_run_on_stderr_as_it_ends():
    code, lines, err = sim("--ranks", "32", "--ranks-per-host", "4", "--bytes", "4K",
                           "--kill", "5@0.5", "--shrink", "--progress")
    assert code == 0, (err, lines)
    figures = r": virtual [\d.]+ us, wall [\d.]+ s, peak [\d.]+ GB$"
    told = [l for l in err.splitlines() if re.search(figures, l)]
    stages = ([r"the fault-free allreduce of 1024 floats ended", r"the group to fault formed",
               r"fault: 31 of 31 survivors name what they lost within \d+ us of it, in \d+ failure "
               r"messages",
               r"shrink: 1 group\(s\), 31 members"] +
              [rf"shrunk group's op {i} of 20, .+: right" for i in range(1, 21)])
    assert len(told) == len(stages), err
    for line, stage in zip(told, stages):
        assert re.match(stage + figures, line), (line, stage)
    assert not any(re.search(figures, l) for l in lines)  # stdout keeps its lines


def test_bad_input_says_what_is_wrong():
    code, _, err = sim("--ranks", "8", "--kill", "9@0.5")
    assert code != 0 and "there are 8 ranks" in err
    code, _, err = sim("--ranks", "8", "--kill", "3-1@0.5")
    assert code != 0 and "give RANKS@FRACTION" in err
    code, _, err = sim("--ranks", "8", "--shrink")
    assert code != 0 and "--shrink needs a fault" in err
    code, _, err = sim("--ranks", "8", "--partition", "0-7@0.5")
    assert code != 0 and "the other side would be empty" in err
    code, _, err = sim("--ranks", "8", "--stall", "3@2")
    assert code != 0 and "give RANK@FRACTION[:MS]" in err
    code, _, err = sim("--hosts", "4,x,4")
    assert code != 0 and "'4,x,4': give each host's number of ranks" in err
    code, _, err = sim("--ranks", "8", "--slow", "3:0.5")
    assert code != 0 and "FACTOR at least 1" in err
    code, _, err = sim("--ranks", "8", "--slow", "9:2")
    assert code != 0 and "cannot slow rank 9 of 8" in err
    code, _, err = sim("--scenario", "xyz")
    assert code != 0 and "seed in hex" in err
    code, _, err = sim("--ranks", "8", "--bytes", "lots")
    assert code != 0 and "'lots' is not a size" in err


def test_a_partition_leaves_one_group_the_side_with_rank_0_of_half():
    code, lines, err = sim("--ranks", "32", "--ranks-per-host", "4", "--bytes", "64K",
                           "--partition", "16-31@0.5", "--shrink")
    assert code == 0, (err, lines)
    part = [l for l in lines if l.startswith("PARTITION")]
    assert part and re.match(r"PARTITION ranks=16-31 named=32 of 32 by_us=[\d.]+ ", part[0]), lines
    # Every rank knows the other side gone within the heartbeat's timeout and a little.
    assert 2.0e6 <= float(part[0].split("by_us=")[1].split()[0]) < 3.0e6, part
    assert [l for l in lines if l.startswith("SHRINK groups=1 members=16 ")], lines


def test_a_stalled_rank_is_named_and_a_slow_one_only_costs_time():
    code, lines, err = sim("--ranks", "16", "--bytes", "64K", "--stall", "5@0.5:4000")
    assert code == 0, (err, lines)
    assert [l for l in lines if re.match(r"STALL rank=5 for_4000_ms named=16 of 16 ", l)], lines
    times = []
    for extra in ([], ["--slow", "5:20"], ["--slow-link", "1:20"]):
        code, lines, err = sim("--ranks", "16", "--ranks-per-host", "4", "--bytes", "1M", *extra)
        assert code == 0 and "CHECK payload=ok" in lines, (err, lines)
        times.append(float(SIM_LINE.match(lines[-1])[4]))
    assert times[1] > 1.5 * times[0] and times[2] > 1.5 * times[0], times


CAMPAIGN_LINE = re.compile(r"CAMPAIGN scenarios=(\d+) hangs=0 wrong=0 unnamed=0 split=0 "
                           r"slow_news=0 over_budget=0 stale_used=0 early_signal=0 wall_s=[\d.]+$")


def test_a_campaign_checks_every_scenario_and_replays_from_its_seed():
    runs = [sim("--campaign", "12", "--seed", "7", "--max-ranks", "64") for _ in range(2)]
    for code, lines, err in runs:
        assert code == 0, (err, lines)
        assert CAMPAIGN_LINE.match(lines[-1]) and lines[-1].startswith("CAMPAIGN scenarios=12 ")
    # The same lines, but for the wall time.
    assert runs[0][1][:-1] == runs[1][1][:-1]
    assert [l for l in runs[0][1] if l.startswith("TRACE digest=")]
    code, lines, err = sim("--scenario", "1b65edfaacb24d12")
    assert code == 0, (err, lines)
    assert lines[0].startswith("scenario 1b65edfaacb24d12: every invariant holds")
    assert "  replay: python -m torch_ddl.sim --scenario 1b65edfaacb24d12" in lines
    assert re.match(r"SCENARIO seed=1b65edfaacb24d12 ranks=25 failed=0 groups=1 members=24 ",
                    lines[-1]), lines


def test_payload_auto_counts_a_block_per_rank_where_the_collective_holds_one():
    # Counted as ranks x bytes before, an allgather of 64 KiB at 1 024 ranks carried 64 GiB of
    # outputs and the run was killed for memory with nothing printed (at 129c27a).
    from torch_ddl.sim import payload_bytes
    assert payload_bytes("allreduce", 1024, 65536) == 1024 * 65536
    for collective in ["allgather", "reduce_scatter", "gather", "scatter", "alltoall"]:
        assert payload_bytes(collective, 1024, 65536) == 1024 * 1024 * 65536
    code, lines, err = sim("--ranks", "256", "--ranks-per-host", "8", "--bytes", "8K",
                           "--collective", "allgather", "--payload-limit", "64M")
    assert code == 0, err
    assert not any(l.startswith("CHECK") for l in lines)  # 512 MiB of outputs: left out
    code, lines, err = sim("--ranks", "64", "--ranks-per-host", "8", "--bytes", "8K",
                           "--collective", "allgather", "--payload-limit", "64M")
    assert code == 0 and "CHECK payload=ok" in lines, err


def test_large_runs_and_campaigns_run_again_with_huge_pages_unless_told_otherwise(monkeypatch):
    import builtins
    import io
    from torch_ddl.sim import HUGE_PAGES, huge_pages_environment, parser

    def environment(*argv):
        return huge_pages_environment(parser().parse_args(list(argv)))

    real_open = builtins.open
    for mode, lent in [("always [madvise] never", True), ("always madvise [never]", False)]:
        monkeypatch.setattr(builtins, "open", lambda path, *a, **k: io.StringIO(mode) if str(
            path).startswith("/sys/kernel/mm/transparent_hugepage") else real_open(path, *a, **k))
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
        big = environment("--ranks", "4096")
        assert (big is not None) == lent
        if lent:
            assert big["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + HUGE_PAGES
            assert environment("--hosts", "2048,2048") is not None
            assert environment("--campaign", "10") is not None
        assert environment("--ranks", "4095") is None
        assert environment("--ranks", "65536", "--no-huge-pages") is None
        assert environment("--scenario", "1b65edfaacb24d12") is None
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
        assert environment("--ranks", "65536") is None  # the user's word stands
    monkeypatch.setattr(builtins, "open", real_open)
