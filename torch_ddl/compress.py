"""An allreduce whose bytes travel in a narrower dtype, summed in float32.

    torch_ddl.compress.all_reduce(tensor, wire_dtype=torch.bfloat16)          # average, in place
    ddp.register_comm_hook(torch_ddl.compress.HookState(torch.bfloat16),
                           torch_ddl.compress.ddp_hook)

For links slow enough that halving or quartering the bytes matters more than exact sums (the
outer exchange of DiLoCo, gradients across racks). A reduce-scatter and an allgather, as a ring
allreduce moves them, but each made of one call: the tensor is cut into one chunk per rank, every
rank sends chunk j, narrowed, to rank j (all_to_all_single); rank j widens the P pieces it got
to float32 and sums them in rank order; it narrows the sum and every rank gathers every sum
(all_gather_into_tensor). Each value is narrowed twice, once on the way in and once as a sum,
never in between: the error does not grow with the number of ranks as a ring that narrows each
partial sum would, and every rank ends with the same bits (each sum is made once, by one rank).

Wire formats:
- ``torch.bfloat16`` (or ``torch.float16``): the values themselves, rounded to nearest even.
- ``torch.int8``: per chunk and sender, the values divided by scale = max |value| / 127, rounded
  to nearest even and clipped to [-127, 127], followed by the scale as 4 bytes of float32. The
  error of a value is at most scale / 2 each way.

Bytes a rank sends: 2 (P - 1) / P of the tensor in the wire dtype (plus 4 bytes a chunk for
int8's scales), as for a ring allreduce of the narrowed tensor. The collectives are the group's
own: any backend with all_to_all_single and all_gather_into_tensor (ddl, gloo) runs it, and on
the same inputs ddl and gloo give the same bits.
"""

import math

import torch
import torch.distributed as dist

__all__ = ["WIRE_DTYPES", "all_reduce", "payload_bytes", "wire_bytes", "HookState", "ddp_hook"]

WIRE_DTYPES = (torch.bfloat16, torch.float16, torch.int8)
_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _check(tensor, wire_dtype, op):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"compress.all_reduce: expected a tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _FLOATS:
        raise TypeError(f"compress.all_reduce: the tensor is {tensor.dtype}; only floating-point "
                        "tensors are narrowed for the wire")
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"compress.all_reduce: wire_dtype {wire_dtype} is not one of "
                         f"{', '.join(str(d) for d in WIRE_DTYPES)}")
    if op not in ("sum", "avg"):
        raise ValueError(f"compress.all_reduce: op must be 'sum' or 'avg', got {op!r}")
    if not tensor.is_contiguous():
        raise ValueError("compress.all_reduce: the tensor must be contiguous (it is reduced in "
                         "place)")


def _bytes(numel, wire_dtype):
    """`numel` values in the wire format (int8: and their 4-byte scale)."""
    return numel + 4 if wire_dtype == torch.int8 else numel * 2


def wire_bytes(numel, wire_dtype, world):
    """Bytes one rank sends to the others for a tensor of `numel` elements."""
    if world <= 1 or numel == 0:
        return 0
    return 2 * (world - 1) * _bytes(math.ceil(numel / world), wire_dtype)


def payload_bytes(numel, wire_dtype, world):
    """The tensor's bytes in the wire format, as one rank hands them to the exchange (int8: with
    a 4-byte scale for each of the `world` chunks)."""
    return _bytes(numel, wire_dtype) + (4 * (world - 1) if wire_dtype == torch.int8 else 0)


def _encode(values, wire_dtype):
    """values: (k, chunk) float32 -> (k, bytes per chunk) uint8 of the wire format."""
    if wire_dtype != torch.int8:
        return values.to(wire_dtype).view(torch.uint8).reshape(values.shape[0], -1)
    scale = values.abs().amax(dim=1, keepdim=True) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(values / safe).clamp_(-127, 127).to(torch.int8)
    return torch.cat([q.view(torch.uint8), scale.view(torch.uint8)], dim=1)


def _decode(raw, wire_dtype, chunk):
    """(k, bytes per chunk) uint8 -> (k, chunk) float32."""
    if wire_dtype != torch.int8:
        return raw.contiguous().view(wire_dtype).float()
    q = raw[:, :chunk].contiguous().view(torch.int8).float()
    scale = raw[:, chunk:].contiguous().view(torch.float32)
    return q * scale


def all_reduce(tensor, wire_dtype=torch.bfloat16, op="avg", group=None, async_op=False):
    """Sums (op='sum') or averages (op='avg') `tensor` over the group in place, its bytes on the
    wire in `wire_dtype`, the sums in float32. Returns None, or with async_op=True a completed
    torch.futures.Future holding the tensor (the exchange itself is blocking)."""
    _check(tensor, wire_dtype, op)
    world = dist.get_world_size(group)
    flat = tensor.view(-1)
    n = flat.numel()
    if world > 1 and n > 0:
        chunk = math.ceil(n / world)
        values = torch.zeros(world * chunk, dtype=torch.float32, device=tensor.device)
        values[:n].copy_(flat)
        send = _encode(values.view(world, chunk), wire_dtype)
        width = send.shape[1]
        received = torch.empty_like(send)
        dist.all_to_all_single(received.view(-1), send.view(-1), group=group)
        total = _decode(received, wire_dtype, chunk).sum(dim=0)  # rank order, float32
        if op == "avg":
            total /= world
        mine = _encode(total.view(1, chunk), wire_dtype).view(-1)
        gathered = torch.empty(world * width, dtype=torch.uint8, device=tensor.device)
        dist.all_gather_into_tensor(gathered, mine, group=group)
        flat.copy_(_decode(gathered.view(world, width), wire_dtype, chunk).view(-1)[:n])
    if not async_op:
        return None
    future = torch.futures.Future()
    future.set_result(tensor)
    return future


class HookState:
    """State of ddp_hook: the wire dtype and the group (None: the process group DDP runs on)."""

    def __init__(self, wire_dtype=torch.bfloat16, group=None):
        if wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"compress.HookState: wire_dtype {wire_dtype} is not one of "
                             f"{', '.join(str(d) for d in WIRE_DTYPES)}")
        self.wire_dtype, self.group = wire_dtype, group
        self.bytes_sent = 0


def ddp_hook(state, bucket):
    """A DDP communication hook (DistributedDataParallel.register_comm_hook): each bucket of
    gradients averaged through all_reduce above. The exchange blocks the backward pass while it
    runs (it does not overlap the next buckets' gradients as DDP's own allreduce does)."""
    grads = bucket.buffer()
    world = dist.get_world_size(state.group)
    state.bytes_sent += wire_bytes(grads.numel(), state.wire_dtype, world)
    return all_reduce(grads, state.wire_dtype, "avg", state.group, async_op=True)
