"""python -m torch_ddl.info: versions, UCX transports, settings and the allreduce plan."""

import socket

import torch

import torch_ddl
from torch_ddl import _C


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def main():
    print(f"torch_ddl  {torch_ddl.__version__}")
    print(f"torch      {torch.__version__}")
    print(f"UCX        {_C.ucx_version()}")
    print(f"host       {socket.gethostname()}")
    print("\nUCX transports available (transport/device):")
    for device in _C.transport_devices():
        print(f"  {device}")
    rows = _C.config_table()
    print("\nSettings (environment variable, value, default):")
    width = max(len(r[0]) for r in rows)
    for name, value, default, description in rows:
        mark = "" if value == default else "   (set)"
        print(f"  {name:<{width}}  {value:<10} default {default:<8}{mark}")
        print(f"  {'':<{width}}  {description}")
    values = {r[0]: r[1] for r in rows}
    algo = values["TORCH_DDL_ALLREDUCE_ALGO"]
    small = int(values["TORCH_DDL_SMALL_BYTES"])
    ring = (f"ring, {values['TORCH_DDL_RINGS']} ring(s), segments of "
            f"{_size(int(values['TORCH_DDL_SEGMENT_BYTES']))}, "
            f"{values['TORCH_DDL_PIPELINE_DEPTH']} in flight per step")
    print("\nAllreduce plan:")
    if algo == "auto":
        print(f"  up to {_size(small)}: recursive doubling")
        print(f"  above {_size(small)}: {ring}")
    elif algo == "ring":
        print(f"  every size: {ring}")
    else:
        print("  every size: recursive doubling")
    print("\nUCX itself is configured with UCX_* variables (e.g. UCX_TLS, UCX_NET_DEVICES).")


if __name__ == "__main__":
    main()
