#!/usr/bin/env bash
# The README's test command timed as a fresh clone runs it, beside HOGS CPU busy-loops:
#   benchmarks/suite_time.sh LABEL HOGS CLONE
# CLONE is a clone of the tree (its nox venv made by an earlier run); __pycache__ and
# coverage data are removed first. "ref" times a fixed Python loop before the run, so
# figures from two sessions (two virtual machines) can be told apart. One line per run is
# appended to suite-time-results.txt beside CLONE; pytest's junit XML goes to
# /tmp/junit-LABEL.xml (benchmarks/suite_files.py sums it per test file).
set -u
label=$1; hogs=$2; clone=$3
cd "$clone" || exit 1
find . -name __pycache__ -type d -prune -exec rm -rf {} + ; rm -rf .pytest_cache .coverage .coverage.*
ref=$(python3 -c "import time;t=time.perf_counter();sum(i*i for i in range(10**7));print(round(time.perf_counter()-t,3))")
pids=()
for _ in $(seq 1 "$hogs"); do (while :; do :; done) & pids+=($!); done
start=$(date +%s.%N)
PYTEST_ADDOPTS="--junitxml=/tmp/junit-$label.xml" python3 -m nox -s tests > "/tmp/suite-time-$label.log" 2>&1; rc=$?
end=$(date +%s.%N)
for p in "${pids[@]}"; do kill "$p"; done
wall=$(python3 -c "print(round($end-$start,1))")
figure=$(grep -E "passed.* in [0-9.]+s" "/tmp/suite-time-$label.log" | tail -1)
workers=$(grep -o "[0-9]* workers" "/tmp/suite-time-$label.log" | head -1)
echo "$label hogs=$hogs ref=${ref}s rc=$rc nox_wall=${wall}s [$workers] $figure" | tee -a "$clone/../suite-time-results.txt"
