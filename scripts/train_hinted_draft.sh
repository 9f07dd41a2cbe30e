#!/usr/bin/env bash
# The hinted draft (DraftConfig.hint_ngram: masked slots also read the copy from the context), stage by stage; every
# stage resumes where it stopped. It starts from the shipped draft, so it needs no teacher-forced corpus.
#   bash scripts/train_hinted_draft.sh data|hint|full|eval|collect
# Run one stage at a time with nothing else heavy on the machine (2 cores: a parallel job slows both 5-10x).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
THREADS=${THREADS:-2}
RES=results/training/hinted
SHIPPED=assets/draft-smollm2-135m
# Regenerated data: the target's own answers, so the hints repeat what the target repeats (teacher-forced text is
# another writer's, and copies from it are right less often than copies from the target's own output).
DATA=${DATA:-data/regen}
COMMON=(--layers 1 --layer-ids 1,15,27 --block-size 8 --seqs-per-step 8 --anchors-per-seq 64 --draft-vocab 8192
        --holdout-shards 2 --threads "$THREADS" --ckpt-every 100 --eval-every 200 --snapshot-base 0)
EVAL=(--prompts "${PROMPTS:-mt-bench}" --limit "${LIMIT:-20}" --max-new-tokens 128 --threads "$THREADS" --no-progress)

case "${1:-}" in
  data)  # the target's greedy (and every 4th shard sampled) answers to ShareGPT prompts, with features of layers 1,15,27
    $PY -m dflash train data --out "$DATA" --prompts "${PROMPTS_N:-640}" --layers 1,15,27 --batch-size 32 \
      --max-new-tokens 192 --threads "$THREADS" ;;
  hint)  # the hint weights alone, on the shipped draft (whose weights stay as they are)
    $PY -m dflash train fit --data "$DATA" --init-from "$SHIPPED" "${COMMON[@]}" --hint-ngram 3 --train-only hint \
      --steps "${STEPS:-800}" --lr 2e-3 --out runs/hinted ;;
  full)  # every weight, from the `hint` run, at a low learning rate
    $PY -m dflash train fit --data "$DATA" --init-from runs/hinted "${COMMON[@]}" --hint-ngram 3 \
      --steps "${STEPS:-1000}" --lr 2e-4 --out runs/hinted-full ;;
  eval)  # RUN's draft against the no-draft loop: alone (dflash) and after copying (dflash-lookup)
    mkdir -p "$RES"
    $PY -m dflash bench "${EVAL[@]}" --methods ar,dflash,dflash-lookup --draft "runs/${RUN:-hinted}" \
      --output "$RES/${RUN:-hinted}-${PROMPTS:-mt-bench}.json" --overwrite ;;
  collect)  # the logs TRAINING.md is generated from
    for r in hinted hinted-full; do
      [ -d "runs/$r" ] || continue
      mkdir -p "$RES/$r"
      cp "runs/$r/runs.jsonl" "$RES/$r/"
      gzip -c "runs/$r/train_log.jsonl" > "$RES/$r/train_log.jsonl.gz"
    done ;;
  *) echo "usage: $0 data|hint|full|eval|collect" >&2; exit 2 ;;
esac
