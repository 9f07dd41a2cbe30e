#!/usr/bin/env bash
# Real-loop tau of the ablation drafts on the same held-out ShareGPT prompts (greedy).
set -u
root=$1; limit=${2:-4}; tokens=${3:-48}
for d in "$root"/*/; do
  name=$(basename "$d")
  for s in 1 4; do
    [ "$s" = 4 ] && [ "$name" != partial ] && [ "$name" != base ] && continue
    echo "$name steps=$s $(.venv/bin/python -m dflash train eval --draft "$d" --prompts sharegpt-heldout --limit "$limit" \
      --max-new-tokens "$tokens" --steps "$s" --no-baseline --quiet --threads 1 2>/dev/null | tail -1)"
  done
done
