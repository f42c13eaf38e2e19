"""torch_ddl.data.InMemoryDataset: every byte read back as the file holds it, by ranks and by
DataLoader workers (fork and spawn), one region per host, errors on every rank before training,
the host's memory (summed PSS) grown by one copy, and nothing left in /dev/shm, also after a rank
was killed."""

import os
import signal
import tempfile
import time
import zlib

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from ddl_testing import run_ranks, start_ranks

SIZES = [0, 1, 7, 4099, 65537, (1 << 20) + 3, 12289, 2, 131071]


def write_files(directory, sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    paths = []
    for i, n in enumerate(sizes):
        path = os.path.join(directory, f"sample{i:04d}.bin")
        with open(path, "wb") as f:
            f.write(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).numpy().tobytes())
        paths.append(path)
    return paths


def contents(path):
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()) or bytearray(1), dtype=torch.uint8)[
            :os.path.getsize(path)]


def shm_used():
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def leftovers():
    return [n for n in os.listdir("/dev/shm") if n.startswith("torch_ddl_data.")]


def pss():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Pss in smaps_rollup")


def _read_back(rank, world, paths):
    from torch_ddl.data import InMemoryDataset

    labels = [i * 10 for i in range(len(paths))]
    ds = InMemoryDataset.from_files(paths, labels)
    assert len(ds) == len(paths)
    for i, p in enumerate(paths):
        x, y = ds[i]
        assert x.dtype == torch.uint8 and torch.equal(x, contents(p)), f"sample {i} differs"
        assert y == labels[i]
    assert torch.equal(ds[-1][0], contents(paths[-1]))
    with pytest.raises(IndexError, match="out of range"):
        ds[len(paths)]
    # One region for the host: every rank holds the same file.
    st = os.fstat(ds._fd)
    ids = [None] * world
    dist.all_gather_object(ids, (st.st_dev, st.st_ino))
    assert len(set(ids)) == 1, ids
    # A write stays in the process that made it.
    original = contents(paths[3])
    if rank == 0:
        ds[3][0][0] += 1
    dist.barrier()
    seen = original.clone()
    seen[0] += 1 if rank == 0 else 0
    assert torch.equal(ds[3][0], seen)
    # Workers, forked and spawned, read the same bytes.
    for method in ("fork", "spawn"):
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=method)
        for i, (x, y) in enumerate(loader):
            # (a forked worker has its parent's private write; a spawned one maps afresh)
            want = seen if i == 3 and method == "fork" else contents(paths[i])
            assert torch.equal(x, want) and y == labels[i], (method, i)
    # A transform, and DistributedSampler reshuffling per epoch.
    sums = InMemoryDataset.from_files(paths, transform=lambda b: int(b.sum()))
    assert [sums[i] for i in range(len(paths))] == [int(contents(p).sum()) for p in paths]
    sampler = DistributedSampler(sums, num_replicas=world, rank=rank, shuffle=True, seed=1)
    orders = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        mine = list(sampler)
        every = [None] * world
        dist.all_gather_object(every, mine)
        assert sorted(set(i for part in every for i in part)) == list(range(len(paths)))
        orders.append(every)
    assert orders[0] != orders[1]
    # Tensors one rank per host provides.
    data = torch.arange(30, dtype=torch.float32).view(10, 3) if rank == 0 else None
    marks = torch.arange(10) * 2 if rank == 0 else None
    held = InMemoryDataset.from_tensors(data, marks)
    assert len(held) == 10
    for i in range(10):
        x, y = held[i]
        assert torch.equal(x, torch.arange(3 * i, 3 * i + 3, dtype=torch.float32)) and y == 2 * i
    loader = DataLoader(held, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    assert torch.equal(torch.cat([x for x, _ in loader]), torch.arange(30.0).view(10, 3))
    for d in (ds, sums, held):
        d.close()


@pytest.mark.parametrize("world", [1, 3])
def test_every_byte_is_read_back_by_ranks_and_workers(world, tmp_path):
    paths = write_files(str(tmp_path), SIZES)
    run_ranks(_read_back, world, paths)
    assert not leftovers()


def _errors(rank, world, paths, directory):
    import torch_ddl.data as data
    from torch_ddl.data import InMemoryDataset

    missing = paths + [os.path.join(directory, "missing.png")]
    with pytest.raises(RuntimeError, match="cannot read .*missing.png on host .*: No such file"):
        InMemoryDataset.from_files(missing)
    # Found at first, unreadable when read (a directory): every rank hears of it all the same.
    with pytest.raises(RuntimeError, match=f"cannot read {directory} on host .*directory"):
        InMemoryDataset.from_files(paths + [directory])
    with pytest.raises(ValueError, match="the ranks' lists of files differ"):
        InMemoryDataset.from_files(paths if rank == 0 else paths[:-1])
    with pytest.raises(ValueError, match="3 labels for"):
        InMemoryDataset.from_files(paths, labels=[1, 2, 3])
    real = data.os.statvfs

    class Small:
        f_bavail = f_blocks = 256
        f_frsize = 4096

    data.os.statvfs = lambda path: Small()
    try:
        with pytest.raises(RuntimeError, match=r"MiB of 9 files do not fit in /dev/shm on host "
                                               r".*: 1\.0 MiB free of 1\.0 MiB"):
            InMemoryDataset.from_files(paths)
    finally:
        data.os.statvfs = real
    with pytest.raises(RuntimeError, match="data must be a tensor"):
        InMemoryDataset.from_tensors(None)
    ds = InMemoryDataset.from_files(paths)  # still usable after the failures
    assert torch.equal(ds[5], contents(paths[5]))


def test_bad_input_fails_every_rank_naming_it(tmp_path):
    paths = write_files(str(tmp_path), SIZES)
    before = shm_used()
    run_ranks(_errors, 2, paths, str(tmp_path))
    assert not leftovers()
    assert shm_used() <= before + (1 << 20)


def _memory(rank, world, paths, total, results):
    from torch_ddl.data import InMemoryDataset

    warm = InMemoryDataset.from_files(paths[:1])  # the code it runs, paged in beforehand
    zlib.crc32(warm[0].numpy())
    warm.close()
    dist.barrier()
    before = pss()
    ds = InMemoryDataset.from_files(paths)
    checksum = [zlib.crc32(ds[i].numpy()) for i in range(len(ds))]  # every page read
    dist.barrier()  # a shared page counts 1/N in each of the N processes mapping it by now
    after = pss()
    grown = [None] * world
    dist.all_gather_object(grown, (after - before, checksum))
    if rank == 0:
        with open(results, "w") as f:
            f.write(repr(grown))
    dist.barrier()


def test_four_ranks_of_a_host_hold_one_copy(tmp_path):
    sizes = [(4 << 20) + 17 * i for i in range(64)]  # 256 MiB
    paths = write_files(str(tmp_path), sizes)
    total = sum(sizes)
    results = str(tmp_path / "pss")
    run_ranks(_memory, 4, paths, total, results)
    grown = eval(open(results).read())
    want = [zlib.crc32(contents(p).numpy()) for p in paths]
    assert all(c == want for _, c in grown)
    summed = sum(g for g, _ in grown)
    assert summed <= 1.25 * total, f"the ranks' PSS grew by {summed / total:.2f}x the files"
    print(f"4 ranks: summed PSS grew by {summed / total:.3f}x the files")
    assert not leftovers()


def _killed(rank, world, paths, victim):
    from torch_ddl.data import InMemoryDataset

    ds = InMemoryDataset.from_files(paths)
    assert torch.equal(ds[3], contents(paths[3]))
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)


@pytest.mark.parametrize("victim", [0, 2])
def test_nothing_is_left_in_dev_shm_after_a_rank_was_killed(victim, tmp_path):
    paths = write_files(str(tmp_path), [1 << 22] * 4)
    before = shm_used()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'store')}"
        ctx = start_ranks(_killed, 3, init, (paths, victim))
        deadline = time.monotonic() + 120
        try:
            while any(p.is_alive() for p in ctx.processes) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join()
    codes = [p.exitcode for p in ctx.processes]
    assert codes[victim] == -signal.SIGKILL and all(
        c == 0 for r, c in enumerate(codes) if r != victim), codes
    assert not leftovers()
    assert shm_used() <= before + (1 << 20), f"{(shm_used() - before) >> 20} MiB left"
