#!/usr/bin/env bash
# The GPU checks of issue 39, in one run, on a machine with an NVIDIA GPU and the `gpu` extra installed
# (pip install -e '.[gpu,pipelines,test,bench]' with torch's CUDA build): what the CPU-only CI cannot verify.
#   tools/gpu_check.sh [OUT]     # OUT (default gpu-check/): the logs, bench.gpu's JSON and its Markdown block
# Each step's status is printed; the script goes on after a failure and exits with the number of failed steps.
set -u
PY=${PYTHON:-python}
OUT=${1:-gpu-check}
mkdir -p "$OUT"
failed=0
step() {  # step NAME COMMAND...: run, log to OUT/NAME.log, print the status and the log's tail
    local name=$1; shift
    local begin=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: status $rc, $((SECONDS - begin)) s"
    tail -n 5 "$OUT/$name.log"
    [ $rc -eq 0 ] || failed=$((failed + 1))
}
step device_info "$PY" -c "import json, ortflow; print(json.dumps(ortflow.device_info(), indent=1))"
step pytest_gpu "$PY" -m pytest -p no:xdist -q -m gpu tests/
step core_suite "$PY" -m pytest -q -m "not slow" tests/ --ignore=tests/test_scale_ray.py
step chain_cuda "$PY" -m pipelines.main experiment=smoke trainer.device=cuda "mlflow.root=$OUT/mlruns"
step bench_gpu "$PY" -m bench.gpu --repeats 3 --epochs 3 --json "$OUT/bench-gpu.json" --doc "$OUT/PERFORMANCE.md"
echo "failed steps: $failed (logs in $OUT/)"
exit $failed
