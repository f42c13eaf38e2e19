"""reduce, gather, scatter, reduce_scatter (list and tensor), all_to_all (list and single, even
and uneven), point-to-point (blocking, isend/irecv, batch_isend_irecv, any source) and the
object collectives over 'ddl', against gloo or an exact reference, at world sizes 1 to 4."""

import warnings

import pytest
import torch
import torch.distributed as dist

from ddl_testing import (WORLD_SIZES, assert_same, ddl_groups_with, make_input, reference,
                         run_ranks, valid)

TYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int32,
         torch.int64, torch.uint8, torch.bool]
OPS = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.AVG, "MAX": dist.ReduceOp.MAX,
       "PRODUCT": dist.ReduceOp.PRODUCT, "BXOR": dist.ReduceOp.BXOR}
SIZES = [0, 1, 13, 4099]


def _reductions(rank, size):
    gloo = dist.new_group(backend="gloo")
    for op_name, op in OPS.items():
        for dtype in TYPES:
            if not valid(dtype, op_name):
                continue
            for n in SIZES:
                x = make_input(dtype, op_name, rank, size, n)
                want = reference(dtype, op_name, size, n)
                for root in range(size):
                    got = x.clone()
                    dist.reduce(got, dst=root, op=op)
                    if rank == root:
                        assert_same(got, want, f"reduce {op_name} {dtype} n={n} root={root}")
                # reduce_scatter: rank r's block b is the input generated for rank r at n*size.
                blocks = make_input(dtype, op_name, rank, size, n * size)
                out = torch.zeros(n, dtype=dtype)
                dist.reduce_scatter(out, list(blocks.chunk(size)) if n else
                                    [torch.empty(0, dtype=dtype)] * size, op=op)
                full = reference(dtype, op_name, size, n * size)
                assert_same(out, full[rank * n:(rank + 1) * n], f"reduce_scatter {op_name} "
                            f"{dtype} n={n}")
                out2 = torch.zeros(n, dtype=dtype)
                dist.reduce_scatter_tensor(out2, blocks.clone(), op=op)
                assert_same(out2, out, f"reduce_scatter_tensor {op_name} {dtype} n={n}")
                if op_name in ("SUM", "MAX") and dtype in (torch.float32, torch.int64):
                    out3 = torch.zeros(n, dtype=dtype)
                    dist.reduce_scatter_tensor(out3, blocks.clone(), op=op, group=gloo)
                    assert_same(out, out3, f"reduce_scatter vs gloo {op_name} {dtype} n={n}")
                    g = x.clone()
                    dist.reduce(g, dst=0, op=op, group=gloo)
                    r = x.clone()
                    dist.reduce(r, dst=0, op=op)
                    if rank == 0:
                        assert_same(r, g, f"reduce vs gloo {op_name} {dtype} n={n}")


def _gather_scatter_alltoall(rank, size):
    gloo = dist.new_group(backend="gloo")
    for dtype in TYPES:
        for n in SIZES:
            x = make_input(dtype, "SUM", rank, size, n)
            for root in range(size):
                outs = [torch.zeros(n, dtype=dtype) for _ in range(size)] if rank == root else None
                dist.gather(x, outs, dst=root)
                if rank == root:
                    for r in range(size):
                        assert_same(outs[r], make_input(dtype, "SUM", r, size, n),
                                    f"gather {dtype} n={n} root={root} block {r}")
                pieces = ([make_input(dtype, "SUM", 100 + r, size, n) for r in range(size)]
                          if rank == root else None)
                got = torch.zeros(n, dtype=dtype)
                dist.scatter(got, pieces, src=root)
                assert_same(got, make_input(dtype, "SUM", 100 + rank, size, n),
                            f"scatter {dtype} n={n} root={root}")
            # all_to_all_single, even: n rows of 3 per rank.
            inp = make_input(dtype, "SUM", rank, size, size * n * 3).reshape(size * n, 3)
            out = torch.zeros_like(inp)
            dist.all_to_all_single(out, inp)
            ref = torch.zeros_like(inp)
            if dtype in (torch.float32, torch.int64):
                dist.all_to_all_single(ref, inp, group=gloo)
            else:
                for p in range(size):
                    src = make_input(dtype, "SUM", p, size, size * n * 3).reshape(size * n, 3)
                    ref[p * n:(p + 1) * n] = src[rank * n:(rank + 1) * n]
            assert_same(out, ref, f"all_to_all_single even {dtype} n={n}")
    # Uneven splits: rank r sends (r + p) % 3 rows to rank p; rows of 2 elements.
    send_splits = [(rank + p) % 3 for p in range(size)]
    recv_splits = [(p + rank) % 3 for p in range(size)]
    inp = torch.arange(sum(send_splits) * 2, dtype=torch.float32).reshape(-1, 2) + 1000 * rank
    out = torch.full((sum(recv_splits), 2), -1.0)
    dist.all_to_all_single(out, inp, recv_splits, send_splits)
    ref = torch.full((sum(recv_splits), 2), -1.0)
    dist.all_to_all_single(ref, inp, recv_splits, send_splits, group=gloo)
    assert_same(out, ref, "all_to_all_single uneven")
    # List form with different sizes per peer.
    ins = [torch.full((rank + p + 1,), float(10 * rank + p)) for p in range(size)]
    outs = [torch.zeros(p + rank + 1) for p in range(size)]
    dist.all_to_all(outs, ins)
    for p in range(size):
        assert_same(outs[p], torch.full((p + rank + 1,), float(10 * p + rank)), f"all_to_all {p}")


def _all_to_all_schedules(rank, size):
    groups = ddl_groups_with("TORCH_DDL_ALLTOALL_ALGO", ("pairwise", "bruck", "auto"))
    gloo = dist.new_group(backend="gloo")
    schedule = {a: g._get_backend(torch.device("cpu")).alltoall_schedule() for a, g in groups.items()}
    assert schedule == {"pairwise": "pairwise", "bruck": "bruck", "auto": "pairwise"}, schedule
    for dtype in (torch.float32, torch.int64, torch.uint8, torch.bfloat16):
        for n in (0, 1, 7, 1031):
            inp = ((torch.arange(size * n) * (rank + 3) + rank) % 251).to(dtype)
            want = torch.empty_like(inp)
            dist.all_to_all_single(want, inp, group=gloo)
            for algo, group in groups.items():
                got = torch.full_like(inp, 7)
                dist.all_to_all_single(got, inp, group=group)
                assert_same(got, want, f"all_to_all_single {algo} {dtype} n={n}")
    # Splits that differ per pair (some empty), and the list form.
    send_splits = [(rank * 7 + p * 3) % 5 * 3 for p in range(size)]
    recv_splits = [(p * 7 + rank * 3) % 5 * 3 for p in range(size)]
    inp = torch.arange(sum(send_splits), dtype=torch.float32) + 1000 * rank
    want = torch.full((sum(recv_splits),), -1.0)
    dist.all_to_all_single(want, inp, recv_splits, send_splits, group=gloo)
    for algo, group in groups.items():
        got = torch.full((sum(recv_splits),), -2.0)
        dist.all_to_all_single(got, inp, recv_splits, send_splits, group=group)
        assert_same(got, want, f"all_to_all_single uneven {algo}")
        ins = [torch.full((rank + p + 1,), float(10 * rank + p)) for p in range(size)]
        outs = [torch.zeros(p + rank + 1) for p in range(size)]
        dist.all_to_all(outs, ins, group=group)
        for p in range(size):
            assert_same(outs[p], torch.full((p + rank + 1,), float(10 * p + rank)),
                        f"all_to_all {algo} {p}")


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_all_to_all_pairwise_and_bruck_match_gloo(size):
    run_ranks(_all_to_all_schedules, size)


def _gather_schedules(rank, size):
    groups = ddl_groups_with("TORCH_DDL_GATHER_ALGO", ("linear", "tree", "auto"))
    gloo = dist.new_group(backend="gloo")
    backend = {a: g._get_backend(torch.device("cpu")) for a, g in groups.items()}
    schedule = {a: b.gather_schedule(4) for a, b in backend.items()}
    assert schedule == {"linear": "linear", "tree": "tree", "auto": "linear"}, schedule
    for dtype in (torch.float32, torch.int64, torch.uint8, torch.bfloat16):
        for n in (0, 1, 7, 1031):
            x = ((torch.arange(n) * (rank + 3) + rank) % 251).to(dtype)
            for root in range(size):
                want = [torch.empty_like(x) for _ in range(size)] if rank == root else None
                dist.gather(x, want, dst=root, group=gloo)
                for algo, group in groups.items():
                    got = [torch.full_like(x, 7) for _ in range(size)] if rank == root else None
                    dist.gather(x, got, dst=root, group=group)
                    if rank == root:
                        for r in range(size):
                            assert_same(got[r], want[r],
                                        f"gather {algo} {dtype} n={n} root={root} block {r}")


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_gather_linear_and_tree_match_gloo(size):
    run_ranks(_gather_schedules, size)


def _point_to_point(rank, size):
    if size == 1:
        return
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    # Blocking, in an order that cannot deadlock: even ranks send first.
    t = torch.arange(1021, dtype=torch.float64) + rank
    r = torch.zeros(1021, dtype=torch.float64)
    if rank % 2 == 0:
        dist.send(t, nxt)
        dist.recv(r, prv)
    else:
        dist.recv(r, prv)
        dist.send(t, nxt)
    assert_same(r, torch.arange(1021, dtype=torch.float64) + prv, "send/recv")
    # Tags keep messages apart; large and empty messages.
    big = torch.full((300000,), float(rank))
    reqs = [dist.isend(big, nxt, tag=5), dist.isend(torch.tensor([rank]), nxt, tag=9),
            dist.isend(torch.empty(0), nxt, tag=11)]
    small, large, empty = torch.zeros(1, dtype=torch.int64), torch.zeros(300000), torch.ones(0)
    for w in [dist.irecv(small, prv, tag=9), dist.irecv(large, prv, tag=5),
              dist.irecv(empty, prv, tag=11)] + reqs:
        w.wait()
    assert small.item() == prv and bool((large == prv).all())
    # batch_isend_irecv around the ring in both directions.
    a, b = torch.zeros(7), torch.zeros(7)
    ops = [dist.P2POp(dist.isend, torch.full((7,), float(rank)), nxt),
           dist.P2POp(dist.irecv, a, prv),
           dist.P2POp(dist.isend, torch.full((7,), float(-rank)), prv),
           dist.P2POp(dist.irecv, b, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert_same(a, torch.full((7,), float(prv)), "batch_isend_irecv forward")
    assert_same(b, torch.full((7,), float(-nxt)), "batch_isend_irecv backward")
    # Receive from any source: rank 0 collects one message from every other rank.
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            v = torch.zeros(1, dtype=torch.int64)
            src = dist.recv(v)
            assert v.item() == 100 * src
            seen.add(src)
        assert seen == set(range(1, size))
    else:
        dist.send(torch.tensor([100 * rank]), 0)
    dist.barrier()


def _objects(rank, size):
    objs = [{"rank": rank, "data": list(range(rank))}, "x" * rank]
    gathered = [None] * size
    dist.all_gather_object(gathered, objs[0])
    assert [g["rank"] for g in gathered] == list(range(size))
    lst = [objs[0], None] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst[0] == {"rank": 0, "data": []}
    out = [None] * size if rank == size - 1 else None
    dist.gather_object(objs[1], out, dst=size - 1)
    if rank == size - 1:
        assert out == ["x" * r for r in range(size)]
    got = [None]
    dist.scatter_object_list(got, [f"to {r}" for r in range(size)] if rank == 0 else None, src=0)
    assert got[0] == f"to {rank}"


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_reduce_and_reduce_scatter(size):
    run_ranks(_reductions, size)


@pytest.mark.parametrize("size", WORLD_SIZES)
def test_gather_scatter_all_to_all(size):
    warnings.simplefilter("ignore")
    run_ranks(_gather_scatter_alltoall, size)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_point_to_point(size):
    run_ranks(_point_to_point, size)


@pytest.mark.parametrize("size", [1, 3])
def test_object_collectives(size):
    run_ranks(_objects, size)
