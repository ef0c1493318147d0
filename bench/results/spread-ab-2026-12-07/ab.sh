#!/bin/bash
# The A/B of the staging area's spread (issue 59): cpu.lock pulled on the machine's own file system,
# ENVSPEC_SPREAD_STAGING off and on alternating, 3 rounds each; run from the repository's root.
set -e
out=bench/results/spread-ab-2026-12-07
for i in 1 2; do
  for m in off on; do
    ENVSPEC_SPREAD_STAGING=$m .venv/bin/python bench/cache.py --lock lockfiles/cpu.lock --rounds 3 \
      --steps envspec,floor --fs here --a-cache ~/.cache/envspec --json $out/cpu-$m-$i.json
  done
done
