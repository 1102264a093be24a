#!/usr/bin/env bash
# The same tests in two pytest processes at once, each in a cpuacct cgroup of its own (root), differing in one
# environment variable: prints each side's wall and CPU seconds.
# Usage: bench/suite_jvms/side_by_side.sh VARIABLE VALUE_A VALUE_B [pytest arguments]
# (default arguments: fourteen Valkey contract tests).
set -euo pipefail
cd "$(dirname "$0")/../.."
var=$1 a=$2 b=$3
shift 3
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(tests/integration/test_contract.py -k "valkey and not sigkill and not random and not backfill_heals")
side() {  # name, value
  local cg=/sys/fs/cgroup/cpuacct/deltadrain-side-$1
  mkdir -p "$cg" && echo $BASHPID > "$cg/cgroup.procs"
  local cpu0 t0; cpu0=$(cat "$cg/cpuacct.usage"); t0=$(date +%s.%N)
  env "$var=$2" .venv/bin/python -m pytest -p no:cacheprovider -n 0 -q "${args[@]}" > "/tmp/deltadrain-side-$1.log" 2>&1 \
    || echo "$1: tests failed (/tmp/deltadrain-side-$1.log)"
  echo "$1 ($var=$2): wall $(echo "$(date +%s.%N) - $t0" | bc) s, CPU $(( ($(cat "$cg/cpuacct.usage") - cpu0) / 1000000000 )) s"
}
side a "$a" & side b "$b" & wait
