#!/usr/bin/env bash
# The drafting system's evaluation: the default chain (copy from the context, then the draft: `dflash-lookup`) and
# the draft alone (`dflash`), each interleaved with the no-draft loop (`ar`), greedy, 128 new tokens, on all 80
# MT-Bench first turns and the first 80 HumanEval problems, in the host's default mode and in float32 (exact).
# About 75 minutes on a 2-core CPU; run it with nothing else on the machine. Each run resumes where it stopped.
#   bash scripts/evaluate_default.sh          the shipped draft (`--preset default`): results/eval/{set}-{mode}.json
#   bash scripts/evaluate_default.sh hinted   the hinted draft on MT-Bench, default mode: results/eval/hinted-mt-bench-auto.json
# TRAINING.md's last section is generated from results/eval/ by scripts/training_report.py.
set -u
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${OUT:-results/eval}
mkdir -p "$OUT"

run() {  # run FILE BENCH_ARGS...: one bench run, resumed if FILE exists
  local f=$1 resume=--overwrite
  shift
  [ -f "$f" ] && resume=--resume
  $PY -m dflash bench --limit 80 --max-new-tokens 128 --methods ar,dflash,dflash-lookup --no-progress \
    --output "$f" $resume "$@"
}

if [ "${1:-}" = hinted ]; then
  run "$OUT/hinted-mt-bench-auto.json" --prompts mt-bench --draft assets/draft-smollm2-135m-hinted
else
  for mode in auto float32; do
    for set in mt-bench humaneval; do
      run "$OUT/$set-$mode.json" --prompts "$set" --dtype "$mode"
    done
  done
fi
echo EVALUATION-DONE
