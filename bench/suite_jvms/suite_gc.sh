#!/usr/bin/env bash
# The suite's drivers under G1 (the JVM's default) and under the throughput collector (the suite's), side by
# side: the same contract tests in two pytest processes at once, each in a cpuacct cgroup of its own (root).
# Prints each side's wall and CPU seconds. Usage: bench/suite_jvms/suite_gc.sh [pytest -k expression]
set -euo pipefail
cd "$(dirname "$0")/../.."
K=${1:-"valkey and not sigkill and not random and not backfill_heals"}
side() {  # name, collector
  local cg=/sys/fs/cgroup/cpuacct/deltadrain-gc-$1
  mkdir -p "$cg" && echo $BASHPID > "$cg/cgroup.procs"
  local cpu0 t0; cpu0=$(cat "$cg/cpuacct.usage"); t0=$(date +%s.%N)
  DELTADRAIN_TEST_GC="$2" .venv/bin/python -m pytest -p no:cacheprovider -n 0 -q \
    tests/integration/test_contract.py -k "$K" > "/tmp/deltadrain-gc-$1.log" 2>&1 || echo "$1: tests failed"
  echo "$1 ($2): wall $(echo "$(date +%s.%N) - $t0" | bc) s, CPU $(( ($(cat "$cg/cpuacct.usage") - cpu0) / 1000000000 )) s"
}
side g1 -XX:+UseG1GC & side parallel -XX:+UseParallelGC & wait
