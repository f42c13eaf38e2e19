"""A dataset kept in memory once per host.

    from torch_ddl.data import InMemoryDataset
    train = InMemoryDataset.from_files(paths, labels, transform=decode)
    loader = DataLoader(train, batch_size=64, sampler=DistributedSampler(train), num_workers=4)

On each host the ranks of the group read the files (each a share of them) into one region of
shared memory with an index; every rank of the host and every DataLoader worker of theirs maps
that one region, so the host holds one copy of the data whatever its ranks and workers. The hosts
are the ones the ddl backend found (the group's topology; other backends: the host name and
/dev/shm). The region has no name once the host's ranks have opened it: it is freed when the last
process mapping it lets go or dies, and nothing is left in /dev/shm.
"""

import mmap
import os
import socket
import uuid
import zlib

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

__all__ = ["InMemoryDataset"]

_MAGIC = b"TDDLMEM1"
_HEADER = 64
_ALIGN = 64
_SHM = "/dev/shm"


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def _hosts(group):
    """(host name, sorted group ranks of that host) for this rank's host."""
    rank = dist.get_rank(group)
    backend = None
    try:
        backend = (group or dist.group.WORLD)._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError):
        pass
    if backend is not None and hasattr(backend, "hosts"):
        for name, ranks in backend.hosts():
            if rank in ranks:
                return name, sorted(ranks)
    # Not ddl: a host is a host name and a /dev/shm (emulated hosts have their own of both).
    try:
        shm = os.stat(_SHM).st_dev
    except OSError:
        shm = None
    keys = [None] * dist.get_world_size(group)
    dist.all_gather_object(keys, (socket.gethostname(), shm), group=group)
    return keys[rank][0], [r for r, k in enumerate(keys) if k == keys[rank]]


def _agree(group, what, error, value=None):
    """Every rank's error (None: none) and value: raises the first error on every rank, else
    returns the values by rank."""
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (value, error), group=group)
    for r, (_, e) in enumerate(gathered):
        if e is not None:
            raise RuntimeError(f"InMemoryDataset.{what}: rank {r}: {e}")
    return [v for v, _ in gathered]


def _create(size, host, what):
    """An unnamed file of `size` bytes in /dev/shm, its memory reserved: (fd, None) or
    (None, why)."""
    try:
        st = os.statvfs(_SHM)
    except OSError as e:
        return None, f"{_SHM} cannot be used on host {host}: {e}"
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    if size > free:
        return None, (f"{_mib(size)} of {what} do not fit in {_SHM} on host {host}: "
                      f"{_mib(free)} free of {_mib(total)}")
    path = os.path.join(_SHM, f"torch_ddl_data.{os.getpid()}.{uuid.uuid4().hex}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as e:
        return None, f"cannot create a region in {_SHM} on host {host}: {e.strerror}"
    os.unlink(path)  # from here on the memory lives only while a process holds it
    try:
        if size:
            os.posix_fallocate(fd, 0, size)  # fails now, not with SIGBUS on a later write
    except OSError as e:
        os.close(fd)
        return None, (f"{_mib(size)} of {what} could not be reserved in {_SHM} on host {host}"
                      f" ({e.strerror}): {_mib(free)} free of {_mib(total)}")
    return fd, None


def _open_peer(pid, fd, writable):
    return os.open(f"/proc/{pid}/fd/{fd}", (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)


class InMemoryDataset(Dataset):
    """Samples held once per host in shared memory; see the module's documentation.

    `dataset[i]` is `transform(sample_i)`, or `(transform(sample_i), labels[i])` when labels were
    given. For files, a sample is a uint8 tensor over the file's bytes in the shared region (no
    copy); for tensors, row i of the tensor. A sample may be written to: the writes stay private
    to the process (the region is mapped copy-on-write).
    """

    def __init__(self):
        raise TypeError("use InMemoryDataset.from_files(...) or InMemoryDataset.from_tensors(...)")

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def from_files(cls, paths, labels=None, transform=None, group=None):
        """Reads `paths` (raw bytes of any kind) into the host's region; every rank of `group`
        (default: the world) calls it with the same paths. A file that cannot be read fails every
        rank, naming it, before any rank returns."""
        paths = [os.fspath(p) for p in paths]
        if labels is not None and len(labels) != len(paths):
            raise ValueError(f"InMemoryDataset.from_files: {len(labels)} labels for "
                             f"{len(paths)} files")
        what = "from_files"
        host, ranks = _hosts(group)
        rank = dist.get_rank(group)
        leader, share = ranks[0], ranks.index(rank)
        # The ranks' lists must be the same: compared before any file is read.
        digest = zlib.crc32("\0".join(paths).encode("utf-8", "surrogateescape"))
        prints = [None] * dist.get_world_size(group)
        dist.all_gather_object(prints, (len(paths), digest), group=group)
        differ = [r for r, p in enumerate(prints) if p != prints[0]]
        if differ:
            raise ValueError(f"InMemoryDataset.from_files: the ranks' lists of files differ: rank "
                             f"{differ[0]} has {prints[differ[0]][0]} files, rank 0 "
                             f"{prints[0][0]} (or the same number with other paths)")
        self = cls.__new__(cls)
        self._init(len(paths), labels, transform, kind="files")
        handle, error, sizes = None, None, None
        if rank == leader:
            sizes = []
            for p in paths:
                try:
                    sizes.append(os.stat(p).st_size)
                except OSError as e:
                    error = f"cannot read {p} on host {host}: {e.strerror}"
                    break
            if error is None:
                offsets, at = [], _align(_HEADER + 8 * (len(paths) + 1))
                for n in sizes:
                    offsets.append(at)
                    at += n
                offsets.append(at)
                fd, error = _create(at, host, f"{len(paths)} files")
                if fd is not None:
                    self._fd, self._bytes = fd, at
                    with mmap.mmap(fd, at) as region:
                        region[:8] = _MAGIC
                        region[8:16] = len(paths).to_bytes(8, "little")
                        index = torch.tensor(offsets, dtype=torch.int64).numpy().tobytes()
                        region[_HEADER:_HEADER + len(index)] = index
                    handle = (os.getpid(), fd, at)
        try:
            handles = _agree(group, what, error, handle)
        except RuntimeError:
            self.close()
            raise
        error = None
        if rank != leader:
            pid, fd, size = handles[leader]
            try:
                self._fd, self._bytes = _open_peer(pid, fd, writable=True), size
            except OSError as e:
                error = (f"cannot open the region of host {host} held by rank {leader} "
                         f"(process {pid}): {e.strerror}")
        if error is None:
            error = self._read(paths, range(share, len(paths), len(ranks)), host)
        try:
            _agree(group, what, error)
        except RuntimeError:
            self.close()
            raise
        self._map()
        self._offsets = torch.frombuffer(self._region, dtype=torch.int64,
                                         count=len(paths) + 1, offset=_HEADER)
        return self

    def _read(self, paths, which, host):
        """Reads the files `which` into their places in the region; what went wrong, or None."""
        path = None
        try:
            with mmap.mmap(self._fd, self._bytes) as region:
                index = torch.frombuffer(region, dtype=torch.int64, count=len(paths) + 1,
                                         offset=_HEADER).tolist()
                view = memoryview(region)
                try:
                    for i in which:
                        path, start, end = paths[i], index[i], index[i + 1]
                        with open(path, "rb") as f:
                            got = f.readinto(view[start:end])
                            if got != end - start or f.read(1):
                                return (f"{path} on host {host} changed size while it was read "
                                        f"({got} bytes where {end - start} were found before)")
                finally:
                    view.release()
        except OSError as e:
            return f"cannot read {path or 'the region'} on host {host}: {e.strerror or e}"
        return None

    @classmethod
    def from_tensors(cls, data, labels=None, transform=None, group=None):
        """Holds `data` (a tensor, samples along its first dimension) and `labels` (a tensor or a
        sequence, optional) in the host's region. Only the first rank of each host's are used:
        the others may pass None for both."""
        what = "from_tensors"
        host, ranks = _hosts(group)
        rank = dist.get_rank(group)
        leader = ranks[0]
        self = cls.__new__(cls)
        self._init(0, None, transform, kind="tensors")
        meta, error = None, None
        if rank == leader:
            if not isinstance(data, torch.Tensor) or data.dim() == 0:
                error = (f"data must be a tensor of samples along its first dimension on the "
                         f"first rank of host {host}, got {type(data).__name__}")
            else:
                if labels is not None and not isinstance(labels, torch.Tensor):
                    labels = torch.as_tensor(labels)
                if labels is not None and len(labels) != len(data):
                    error = f"{len(labels)} labels for {len(data)} samples"
        if rank == leader and error is None:
            parts, at = [], _HEADER
            for t in (data, labels):
                if t is None:
                    parts.append(None)
                    continue
                at = _align(at)
                parts.append((tuple(t.shape), t.dtype, at))
                at += t.numel() * t.element_size()
            fd, error = _create(at, host, "tensors")
            if fd is not None:
                self._fd, self._bytes = fd, at
                with mmap.mmap(fd, at) as region:
                    region[:8] = _MAGIC
                    for t, part in zip((data, labels), parts):
                        if part is not None:
                            _view(region, *part).copy_(t)
                meta = (os.getpid(), fd, at, parts)
        try:
            handles = _agree(group, what, error, meta)
        except RuntimeError:
            self.close()
            raise
        pid, fd, size, parts = handles[leader]
        error = None
        if rank != leader:
            try:
                self._fd, self._bytes = _open_peer(pid, fd, writable=False), size
            except OSError as e:
                error = (f"cannot open the region of host {host} held by rank {leader} "
                         f"(process {pid}): {e.strerror}")
        _agree(group, what, error)
        self._count, self._parts = parts[0][0][0], parts
        self._map()
        self._tensors()
        return self

    # -- the mapping -----------------------------------------------------------------------

    def _init(self, count, labels, transform, kind):
        self._count, self._labels, self._transform, self._kind = count, labels, transform, kind
        self._fd, self._bytes, self._region, self._parts = None, 0, None, None

    def _map(self):
        # Copy-on-write: reads share the host's pages, a write makes a private copy of its page.
        self._region = mmap.mmap(self._fd, self._bytes, flags=mmap.MAP_PRIVATE,
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE)

    def _tensors(self):
        data, labels = self._parts
        self._data = _view(self._region, *data)
        self._tensor_labels = _view(self._region, *labels) if labels is not None else None

    def __getstate__(self):
        # A DataLoader worker started by spawn or forkserver maps the region through this
        # process's descriptor (a forked worker inherits the mapping and never gets here).
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_region", "_offsets", "_data", "_tensor_labels", "_fd")}
        state["_owner"] = (os.getpid(), self._fd)
        return state

    def __setstate__(self, state):
        pid, fd = state.pop("_owner")
        self.__dict__.update(state)
        self._fd = _open_peer(pid, fd, writable=False) if fd is not None else None
        self._map()
        if self._kind == "files":
            self._offsets = torch.frombuffer(self._region, dtype=torch.int64,
                                             count=self._count + 1, offset=_HEADER)
        else:
            self._tensors()

    def close(self):
        """Lets go of this process's mapping now (tensors still viewing it keep it alive)."""
        for name in ("_offsets", "_data", "_tensor_labels"):
            self.__dict__.pop(name, None)
        region, self._region = getattr(self, "_region", None), None
        if region is not None:
            try:
                region.close()
            except BufferError:  # samples still view it: it goes with the last of them
                pass
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def __del__(self):
        self.close()

    # -- the dataset -----------------------------------------------------------------------

    @property
    def nbytes(self):
        """Bytes of the host's region (index and data)."""
        return self._bytes

    def __len__(self):
        return self._count

    def raw(self, i):
        """Sample i as held, before the transform: a uint8 tensor over the file's bytes, or row i
        of the tensor (no copy either way)."""
        if not -self._count <= i < self._count:
            raise IndexError(f"InMemoryDataset: index {i} out of range for {self._count} samples")
        i %= self._count
        if self._kind != "files":
            return self._data[i]
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        if end == start:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(self._region, dtype=torch.uint8, count=end - start, offset=start)

    def __getitem__(self, i):
        sample = self.raw(i)
        i %= self._count
        if self._kind == "files":
            label = self._labels[i] if self._labels is not None else None
        else:
            label = self._tensor_labels[i] if self._tensor_labels is not None else None
        if self._transform is not None:
            sample = self._transform(sample)
        if self._kind == "files":
            return sample if self._labels is None else (sample, label)
        return sample if self._tensor_labels is None else (sample, label)


def _view(region, shape, dtype, offset):
    count = 1
    for s in shape:
        count *= s
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(region, dtype=dtype, count=count, offset=offset).view(shape)
