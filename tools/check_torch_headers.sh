#!/usr/bin/env bash
# Compiles the torch glue (syntax only) against another torch's headers, without installing it:
#   tools/check_torch_headers.sh 2.11.0
# Downloads that torch wheel once (about 0.5 GB) into build/torch-<version>/ and unpacks only its
# headers. Keeps csrc/torch/compat.hpp honest about the versions it claims.
set -euo pipefail
version=${1:?usage: $0 TORCH_VERSION}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
dir=$root/build/torch-$version
if [ ! -d "$dir/torch/include" ]; then
  mkdir -p "$dir"
  pyver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
    "torch==$version" -d "$dir"
  unzip -q -o "$dir"/torch-*.whl 'torch/include/*' -d "$dir"
  rm -f "$dir"/torch-*.whl
fi
pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
ucxinc=$("$py" "$root/tools/find_ucx.py" --include)
for f in "$root"/csrc/torch/*.cpp; do
  g++ -std=c++20 -fsyntax-only -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H \
    -I"$dir/torch/include" -I"$dir/torch/include/torch/csrc/api/include" -I"$pyinc" \
    -I"$ucxinc" "$f"
  echo "ok: $(basename "$f") compiles against torch $version"
done
