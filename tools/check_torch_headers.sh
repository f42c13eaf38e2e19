#!/usr/bin/env bash
# Compiles the torch glue (syntax only) against another torch's headers, without installing it:
#   tools/check_torch_headers.sh 2.11.0
# Downloads that torch wheel once (about 0.5 GB) into build/torch-<version>/ and unpacks only its
# headers. Keeps csrc/torch/compat.hpp honest about the versions it claims. Where nvcc is found
# (CUDA_HOME, else the PATH) the CUDA part is checked too: its glue against the wheel's CUDA
# headers, and the device code compiled for Hopper (sm_90), as a CUDA build would.
set -euo pipefail
version=${1:?usage: $0 TORCH_VERSION}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
dir=$root/build/torch-$version
if [ ! -d "$dir/torch/include" ]; then
  mkdir -p "$dir"
  pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
  # (past a local cap on the versions pip may fetch: only headers are taken from it)
  PIP_CONSTRAINT=/dev/null "$py" -m pip download -q --no-deps --only-binary=:all: \
    --python-version "$pyver" "torch==$version" -d "$dir"
  unzip -q -o "$dir"/torch-*.whl 'torch/include/*' -d "$dir"
  rm -f "$dir"/torch-*.whl
fi
pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
ucxinc=$("$py" "$root/tools/find_ucx.py" --include)
glue() {
  g++ -std=c++20 -fsyntax-only -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H \
    -I"$dir/torch/include" -I"$dir/torch/include/torch/csrc/api/include" -I"$pyinc" \
    -I"$ucxinc" "$@"
  echo "ok: $(basename "${@: -1}") compiles against torch $version"
}
for f in "$root"/csrc/torch/*.cpp; do glue "$f"; done
cuda=
for c in ${CUDA_HOME:-} "$(dirname "$(dirname "$(command -v nvcc || echo /none/bin/nvcc)")")" \
  /usr/local/cuda; do
  if [ -x "$c/bin/nvcc" ] && [ -f "$c/include/cuda_runtime.h" ]; then cuda=$c; break; fi
done
if [ -z "$cuda" ]; then
  echo "skipped: the CUDA part (no CUDA toolkit with nvcc was found; set CUDA_HOME)"
  exit 0
fi
if [ ! -d "$dir/torch/include/c10/cuda" ]; then
  echo "skipped: the CUDA part (torch $version's wheel for this machine has no CUDA headers)"
  exit 0
fi
for f in "$root"/csrc/torch/cuda/*.cpp; do glue -I"$cuda/include" "$f"; done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
release=$("$cuda/bin/nvcc" --version | grep -o 'release [0-9.]*')
for f in "$root"/csrc/cuda/*.cu; do
  "$cuda/bin/nvcc" -std=c++20 -O3 -arch=sm_90 -I"$ucxinc" -c "$f" -o "$out/$(basename "$f").o"
  echo "ok: $(basename "$f") compiles with nvcc $release"
done
