#!/usr/bin/env bash
# The test suite's driver JVMs: four spawned-JVM tests (two DAG runs through spark-submit, the
# backfill/replay CLI, a split drain) run under each DELTADRAIN_DRIVER_JAVA_OPTIONS side in turn.
# Prints wall, user and sys seconds of the whole pytest process tree per side.
# Usage: bench/suite_jvms/suite_jvm_options.sh SIDE...   (SIDE: default | c1 | c1serial), e.g. `default c1` then
# `c1 default`.
set -euo pipefail
cd "$(dirname "$0")/../.."
TESTS=(
  "tests/integration/test_dags.py::test_ingest_dag_drains_through_spark_submit"
  "tests/integration/test_dags.py::test_ingest_dag_failure_carries_the_drains_own_error"
  "tests/integration/test_backfill_replay.py::test_backfill_and_replay_commands"
  "tests/integration/test_valkey_drain.py::test_a_split_across_streams_reads_the_first_half_in_stream_order_then_the_rest_whole_then_new_entries"
)
for side in "$@"; do
  case "$side" in
    default) opts="" ;;  # an empty value: conftest's setdefault leaves it, so no extra option
    c1) opts="-XX:TieredStopAtLevel=1" ;;
    c1serial) opts="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" ;;  # one GC thread, no G1 concurrent work
    *) echo "unknown side: $side" >&2; exit 2 ;;
  esac
  DELTADRAIN_DRIVER_JAVA_OPTIONS="$opts" /usr/bin/time -f "$side wall=%e user=%U sys=%S" \
    .venv/bin/pytest -q -p no:cacheprovider "${TESTS[@]}" 2>&1 | tail -2
done
