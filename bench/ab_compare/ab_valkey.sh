#!/bin/bash
# Before/after on the same Valkey entries, alternating: bench/ab_compare/ab_drain.py with 7 batches, from the
# checkout before the change (its include/ directory) and from this one, twice each.
#   git worktree add /tmp/before <commit>
#   DELTADRAIN_HOME=/tmp/ddab DELTADRAIN_VALKEY_PORT=26996 bench/ab_compare/ab_valkey.sh /tmp/before/include WORKDIR PIPELINE
# (WORKDIR and PIPELINE as set up by bench/ab_compare/ab_setup_valkey.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
BEFORE=$1 WORK=$2 NAME=$3
export DELTADRAIN_JARS=${DELTADRAIN_JARS:-$PWD/.cache/jars}
for tag in before1 after1 before2 after2; do
  case $tag in before*) SRC=$BEFORE;; *) SRC=$PWD/include;; esac
  echo "== $tag"
  PYTHONPATH=$SRC .venv/bin/python bench/ab_compare/ab_drain.py "$WORK/$tag.yaml" "$NAME" 7 2>&1 \
    | grep -v -E "WARN|Setting default|To adjust"
done
