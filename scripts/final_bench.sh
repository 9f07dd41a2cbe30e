#!/usr/bin/env bash
# The measurements quoted in BENCHMARKS.md / TRAINING.md for the shipped default draft (subset sizes chosen to
# fit the shared 2-core machine; the full-set commands are in BENCHMARKS.md).
set -u
B=".venv/bin/python -m dflash bench --preset default --threads 1"
$B --prompts mt-bench --limit 8 --max-new-tokens 128 --methods ar,dflash,hf-generate,hf-prompt-lookup --output results/mtbench-greedy.json --no-progress
$B --prompts humaneval --limit 8 --max-new-tokens 128 --methods ar,dflash --output results/humaneval-greedy.json --no-progress
$B --prompts mt-bench --limit 4 --max-new-tokens 64 --methods ar,dflash --temperature 0.7 --output results/mtbench-t0.7.json --no-progress
for cfg in "--steps 2" "--steps 4" "--adaptive slow-start" "--adaptive cost" "--acceptance-threshold 0.9" "--acceptance-threshold 0.7" "--block-size 4"; do
  name=$(echo "$cfg" | tr -d ' -' )
  $B --prompts mt-bench --limit 4 --max-new-tokens 64 --methods ar,dflash $cfg --output "results/knob-$name.json" --no-progress
done
echo FINAL-BENCH-DONE
