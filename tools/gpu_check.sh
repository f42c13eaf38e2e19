#!/usr/bin/env bash
# What a machine with a GPU checks, step by step (each fits in a 10-minute command):
#   tools/gpu_check.sh build       build in place against this python's torch (CUDA when it has it)
#   tools/gpu_check.sh test        the Python suite with the GPU visible (CUDA tests included)
#   tools/gpu_check.sh bench       allreduce of CUDA tensors, ddl against gloo, 2 ranks on one GPU
#   tools/gpu_check.sh conformance PyTorch's CI subset with the GPU hidden (the suite skips every
#                                  test when it sees fewer GPUs than ranks)
#   tools/gpu_check.sh all         the four in turn
# It uses the python that holds torch (PYTHON, else python3) and no virtual environment. Where
# libucx-cu13 or expecttest is not importable and there is no network, put their wheels in .whl/
# (pip download --no-deps ... -d .whl); they are installed into build/gpu-site/. Logs go to
# OUT_DIR (default build/gpu-check/), one per step; each step prints its summary line.
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
  "$py" -c "import sys, torch, torch_ddl
built = torch_ddl._C.cuda_built()
print('cuda built:', built)
sys.exit(1 if torch.cuda.is_available() and not built else 0)"
}
tests() { "$py" -m pytest tests/python -q -rs -p no:cacheprovider; }
bench() {
  "$py" benchmarks/allreduce_bench.py --device cuda --world-size 2 --min-bytes 64K \
    --max-bytes 64M --budget 0.25 --rounds 3 --phases
}
conformance() { CUDA_VISIBLE_DEVICES="" PYTHON=$py tests/conformance/run.sh subset ddl 2; }

what=${1:-all}
case "$what" in
  build) step build build ;;
  test) step test tests ;;
  bench) step bench bench ;;
  conformance) step conformance conformance ;;
  all)
    status=0
    step build build || exit 1
    step test tests || status=1
    step bench bench || status=1
    step conformance conformance || status=1
    exit $status
    ;;
  *)
    echo "usage: $0 build|test|bench|conformance|all" >&2
    exit 2
    ;;
esac
