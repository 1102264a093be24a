#!/usr/bin/env bash
# `deltadrain status`, `dlq list` and `metrics` on demo-sized tables: the commit BEFORE (default
# 539b50d, where they read the lake through a Spark session) against this tree (delta-rs, no JVM),
# side by side in one hyperfine run.
#
# Usage: bench/cli_reads/cli_reads.sh [BEFORE] [RUNS] [OUTPUT.json] [WARMUP] [BEFORE_LABEL] [AFTER_LABEL]
# (the labels name the two sides in the output: JVM and delta-rs by default)
# Run from the repository root with DELTADRAIN_HOME (and the DELTADRAIN_*_PORT variables) naming
# services of its own. Without a target table there yet, it starts Valkey and Kafka and makes the
# demo's tables: 5000 events per pipeline, 2% malformed (and a poison ratio of 0.0005 for orders),
# each drained once. Needs hyperfine.
set -euo pipefail
BEFORE=${1:-539b50d}
RUNS=${2:-3}
OUTPUT=${3:-bench/cli_reads/cli_reads.json}
WARMUP=${4:-1}
BEFORE_LABEL=${5:-JVM}
AFTER_LABEL=${6:-delta-rs}
ROOT=$(pwd)
PY="$ROOT/.venv/bin/python"
: "${DELTADRAIN_HOME:?set DELTADRAIN_HOME to a home of its own}"
export PYTHONPATH="$ROOT/include"

if [ ! -d "$DELTADRAIN_HOME/lake/orders/_delta_log" ]; then
  "$PY" -m deltadrain.cli services up --only valkey,kafka
  "$PY" -m deltadrain.cli produce orders --count 5000 --malformed-ratio 0.02 --poison-ratio 0.0005 --no-progress
  "$PY" -m deltadrain.cli drain orders --max-batches 3
  "$PY" -m deltadrain.cli produce clicks --count 5000 --malformed-ratio 0.02 --no-progress
  "$PY" -m deltadrain.cli drain clicks
fi

# The tree at BEFORE, next to this one (it finds the jar cache and the config through DELTADRAIN_JARS and
# DELTADRAIN_CONFIG).
OLD=$(mktemp -d)
trap 'rm -rf "$OLD"' EXIT
git archive "$BEFORE" include | tar -x -C "$OLD"
export DELTADRAIN_JARS=${DELTADRAIN_JARS:-$ROOT/.cache/jars} DELTADRAIN_CONFIG=${DELTADRAIN_CONFIG:-$ROOT/config/pipelines.yaml}

args=()
for cmd in "status orders" "status clicks" "dlq list orders" "metrics orders"; do
  args+=(-n "$BEFORE_LABEL: $cmd" "PYTHONPATH=$OLD/include $PY -m deltadrain.cli $cmd")
  args+=(-n "$AFTER_LABEL: $cmd" "PYTHONPATH=$ROOT/include $PY -m deltadrain.cli $cmd")
done
hyperfine --warmup "$WARMUP" --runs "$RUNS" --output=null --export-json "$OUTPUT" "${args[@]}"
