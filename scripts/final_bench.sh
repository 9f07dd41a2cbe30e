#!/usr/bin/env bash
# Every measurement BENCHMARKS.md quotes, with the installed draft and the settings the host probe chooses
# (quiet machine: nothing else running; about an hour on a 2-core CPU). Then:
#   python scripts/host_settings.py table && python scripts/benchmarks_headline.py
set -u
PY=.venv/bin/python
B="$PY -m dflash bench --preset default"
$PY scripts/host_settings.py record
$B --prompts mt-bench --max-new-tokens 128 --methods ar,dflash,hf-generate,hf-prompt-lookup --output results/mtbench-greedy.json --overwrite --no-progress
$B --prompts humaneval --limit 16 --max-new-tokens 128 --methods ar,dflash --output results/humaneval-greedy.json --overwrite --no-progress
$B --prompts mt-bench --limit 8 --max-new-tokens 64 --methods ar,dflash --temperature 0.7 --output results/mtbench-t0.7.json --overwrite --no-progress
$B --prompts mt-bench --max-new-tokens 128 --methods ar,dflash,dflash-lookup --output results/mtbench-lookup.json --overwrite --no-progress
$B --prompts humaneval --limit 20 --max-new-tokens 128 --methods ar,dflash,dflash-lookup --output results/humaneval-lookup.json --overwrite --no-progress
# The default block policy is auto (cost on a CPU); "--adaptive fixed" is the paper's fixed block of 8.
for cfg in "--adaptive fixed" "--adaptive fixed --block-size 4" "--adaptive slow-start" "--steps 2" "--steps 4" "--acceptance-threshold 0.9" "--acceptance-threshold 0.7"; do
  name=$(echo "$cfg" | tr -d ' -' )
  $B --prompts mt-bench --limit 4 --max-new-tokens 64 --methods ar,dflash $cfg --output "results/knob-$name.json" --overwrite --no-progress
done
echo FINAL-BENCH-DONE
