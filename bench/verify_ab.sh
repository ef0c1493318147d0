#!/bin/bash
# The verifier of two trees on one GPU machine, same lock, each run twice: OLD (a directory holding
# an envspec/ package with its verify/, e.g. `git archive REV src/envspec/verify`) and this tree's
# src. For the device machine: docs/verify-h200.md, "The typed verifier against the one before".
#
#   bash bench/verify_ab.sh OLD_DIR RESULTS_DIR [LOCK]
#   python3 bench/verify_ab_compare.py RESULTS_DIR
set -u
old=$(realpath "$1") out=$2 lock=${3:-lockfiles/h200-host.lock}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi -L
PY=${PYTHON:-python3}
for round in 1 2; do
  for side in old new; do
    if [ "$side" = old ]; then P=$old; else P=$PWD/src; fi
    for level in quick full; do
      s=$(date +%s.%N)
      PYTHONPATH=$P timeout 200 "$PY" -m envspec.verify --lock "$lock" --level "$level" --json \
        > "$out/$side-$level-$round.json" 2> "$out/$side-$level-$round.err"
      echo "$side $level round $round rc=$? wall=$(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')"
    done
    PYTHONPATH=$P ENVSPEC_LOCK=$lock ENVSPEC_VERIFY=warn timeout 60 "$PY" -m envspec.verify --startup \
      > "$out/$side-startup-$round.txt" 2>&1
    echo "$side startup rc=$?"
    PYTHONPATH=$P timeout 60 "$PY" -m envspec.verify.health --record > "$out/$side-health-$round.json" 2>&1
    echo "$side health rc=$?"
    PYTHONPATH=$P timeout 200 "$PY" -m envspec.verify --lock tests/data/verify/h200-wrong-a100.lock \
      --level quick --json > "$out/$side-wrong-$round.json" 2>/dev/null
    echo "$side wrong rc=$?"
  done
done
