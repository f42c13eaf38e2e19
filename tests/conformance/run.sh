#!/usr/bin/env bash
# Runs PyTorch's distributed suite over one or more backends and world sizes and prints the
# counts, one line each.
#   tests/conformance/run.sh subset ddl 2          the CI subset (ci_subset.txt)
#   tests/conformance/run.sh full "ddl gloo" "2 3"  everything, both backends, both sizes
# Each test's ranks are spawned, as PyTorch's CI starts them; CONFORMANCE_START=fork forks them
# from the process that imported the suite (make conformance: the whole suite in 1.5 minutes).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
what=${1:-subset}
backends=${2:-ddl}
sizes=${3:-2}
suite=tests/conformance/run_suite.py
selection=("$suite")
if [ "$what" = subset ]; then
  selection=()
  while read -r name; do
    case "$name" in "" | \#*) continue ;; esac
    selection+=("$suite::TestDistBackendWithSpawn::$name")
  done <"$root/tests/conformance/ci_subset.txt"
fi
mkdir -p "$root/build/conformance"
status=0
cd "$root"
for backend in $backends; do
  for size in $sizes; do
    log=build/conformance/$what-$backend-$size.log
    BACKEND=$backend WORLD_SIZE=$size "$py" -m pytest "${selection[@]}" -q -rs -p no:cacheprovider \
      --junitxml="build/conformance/$what-$backend-$size.xml" >"$log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=$rc
    echo "conformance ($what) backend=$backend world_size=$size: $(tail -n 1 "$log")"
  done
done
exit $status
