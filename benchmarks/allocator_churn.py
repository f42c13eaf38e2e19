"""A training step's large temporaries under TORCH_DDL_SHARED_ALLOCATOR=1, against torch's own
allocator (glibc) in the same run: per step, --tensors tensors of --mib MiB each are allocated,
filled and freed, beside one live 4 MiB tensor. Prints the median step of each and their ratio.

    python benchmarks/allocator_churn.py [--tensors 4] [--mib 64] [--steps 20]

The arena keeps a freed segment's memory for a second (csrc/core/shm/shared_arena.h), so the
next step finds its pages; glibc maps blocks this large afresh each time.
"""
import argparse
import os
import subprocess
import sys

STEP = r"""
import sys, time, torch, torch_ddl
tensors, elements, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
live = torch.ones(1 << 20)
times = []
for _ in range(steps):
    start = time.perf_counter()
    temporaries = [torch.empty(elements).fill_(1.0) for _ in range(tensors)]
    del temporaries
    times.append(time.perf_counter() - start)
print(sorted(times)[len(times) // 2] * 1e3)
"""


def median_step_ms(allocator, tensors, mib, steps):
    env = dict(os.environ, TORCH_DDL_SHARED_ALLOCATOR="1" if allocator else "0")
    out = subprocess.run([sys.executable, "-c", STEP, str(tensors), str(mib << 18), str(steps)],
                         env=env, check=True, capture_output=True, text=True, timeout=600)
    return float(out.stdout.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=4)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    arena = median_step_ms(True, args.tensors, args.mib, args.steps)
    glibc = median_step_ms(False, args.tensors, args.mib, args.steps)
    print(f"{args.tensors} x {args.mib} MiB a step: shared allocator {arena:.1f} ms, "
          f"torch's allocator {glibc:.1f} ms, ratio {arena / glibc:.2f}")


if __name__ == "__main__":
    main()
