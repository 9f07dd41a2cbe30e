#!/usr/bin/env bash
# Draft-training ablations on one frozen data snapshot (same held-out shards for every run).
# Usage: scripts/ablate.sh DATA_DIRS OUT_ROOT STEPS   (each run: 1 thread; results in OUT_ROOT/*/train_log.jsonl)
set -u
data=$1; root=$2; steps=${3:-150}
common="--data $data --steps $steps --seqs-per-step 4 --anchors-per-seq 16 --block-size 8 --eval-every $steps --ckpt-every $steps --threads 1"
run() { name=$1; shift; [ -f "$root/$name/model.safetensors" ] || .venv/bin/python -m dflash train fit $common --out "$root/$name" "$@" > "$root/$name.log" 2>&1; }
mkdir -p "$root"
run base --kl-weight 0.5
run no-kl --kl-weight 0.0
run layers2 --kl-weight 0.5 --layers 2
run partial --kl-weight 0.5 --partial-prob 0.3
run feat3 --kl-weight 0.5 --layer-ids 1,15,27
run half-data --kl-weight 0.5 --data-fraction 0.5
echo ABLATIONS-DONE
