#!/usr/bin/env bash
# The default draft's training campaign, stage by stage; every stage resumes where it stopped.
#   bash scripts/train_default_draft.sh data|data-later|data-long|data-later-long|ablate|fit|warm|ablate-depth|ablate-scratch|ablate-gamma|deep|curve|curve-warm|curve-deep|plot|
#                                       copy-gap|collect|eval|report
# Run one stage at a time with nothing else heavy on the machine (2 cores: a parallel job slows both 5-10x).
# Long stages: nohup bash scripts/train_default_draft.sh fit > runs/fit.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
THREADS=${THREADS:-2}
STEPS=${STEPS:-12000}
RES=results/training
FIT=(--data data/tf1 --layers 1 --layer-ids 1,15,27 --block-size 8 --steps "$STEPS" --seqs-per-step 5
     --anchors-per-seq 16 --lr 8e-4 --kl-weight 0 --partial-prob 0 --draft-vocab 8192 --threads "$THREADS"
     --ckpt-every 500 --eval-every 500 --snapshot-base 250)
CURVE=(--prompts sharegpt-heldout --limit 16 --max-new-tokens 64 --threads "$THREADS")

# The from-scratch ablations (`scratch1`, `scratch2`, `gamma1`) ran on the first 128 shards of data/tf1 (4 length-sorting
# windows: stop `data` there); the same shards, hence the same batches and held-out shard, make them comparable.
scratch_run() {  # NAME FIT-ARGS...: the `fit` recipe from random weights, stopped at STOP_AT, then its τ curve
  local name=$1; shift
  local n; n=$(find data/tf1 -name 'shard_*.safetensors' | wc -l)
  [ "$n" -eq 128 ] || { echo "$name: needs exactly the first 128 shards of data/tf1 (found $n)" >&2; exit 2; }
  $PY -m dflash train fit "${FIT[@]}" "$@" --onpolicy-blocks 1 --out "runs/$name" --stop-at "${STOP_AT:-2000}"
  $PY scripts/training_curve.py --run "runs/$name" --out "$RES/$name/curve.jsonl" --label "$name" "${CURVE[@]}" \
    --steps "1000,${STOP_AT:-2000}"
}

case "${1:-}" in
  data)  # teacher-forced data: ShareGPT replies through the target once, labels = its own predictions
    $PY -m dflash train data-tf --out data/tf1 --conversations 30000 --layers 1,15,27 --batch-size 16 --threads "$THREADS" ;;
  data-later)  # more diverse data: the second and later replies of ShareGPT conversations, earlier turns as history
    $PY -m dflash train data-tf --out data/tf-later --turns later --conversations 30000 --layers 1,15,27 \
      --max-prompt-tokens 384 --batch-size 16 --threads "$THREADS" ;;
  data-long)  # first turns with longer prompts (160 < prompt <= 512 tokens): disjoint from the `data` set
    $PY -m dflash train data-tf --out data/tf-long --conversations 30000 --layers 1,15,27 --min-prompt-tokens 160 \
      --max-prompt-tokens 512 --batch-size 16 --threads "$THREADS" ;;
  data-later-long)  # later turns with longer histories (384 < prompt <= 1024 tokens): disjoint from `data-later`
    $PY -m dflash train data-tf --out data/tf-later-long --turns later --conversations 30000 --layers 1,15,27 \
      --min-prompt-tokens 384 --max-prompt-tokens 1024 --batch-size 16 --threads "$THREADS" ;;
  ablate)  # the same schedule, two variants, stopped at step 1000; the better one is resumed by `fit`
    $PY -m dflash train fit "${FIT[@]}" --onpolicy-blocks 0 --out runs/tf-all --stop-at 1000
    $PY -m dflash train fit "${FIT[@]}" --onpolicy-blocks 1 --out runs/onpolicy --stop-at 1000
    for r in tf-all onpolicy; do
      $PY scripts/training_curve.py --run runs/$r --out $RES/$r/curve.jsonl --label $r "${CURVE[@]}" --steps 1000
    done ;;
  fit)  # resume the chosen run to the end of its schedule
    $PY -m dflash train fit "${FIT[@]}" --onpolicy-blocks "${ONPOLICY:-1}" --out "runs/${RUN:-onpolicy}" --stop-at "${STOP_AT:-0}" ;;
  warm)  # the shipped draft, continued on the larger corpus (first + later turns) with a fresh cosine schedule
    $PY -m dflash train fit --data data/tf1,data/tf-later --init-from "${INIT:-runs/onpolicy}" --layers 1 --layer-ids 1,15,27 \
      --block-size 8 --steps "${WARM_STEPS:-9000}" --seqs-per-step 5 --anchors-per-seq 16 --lr 5e-4 --kl-weight 0 \
      --partial-prob 0 --draft-vocab 8192 --threads "$THREADS" --ckpt-every 500 --eval-every 500 --snapshot-base 250 \
      --onpolicy-blocks 1 --out runs/warm --stop-at "${STOP_AT:-0}" ;;
  ablate-depth)  # from the warm run, on the whole corpus: depth 1 vs depth 2 (a new layer appended whose residual
                 # writes start at 0), the same schedule, stopped at step 1500; `deep` resumes the better one
    for L in 1 2; do
      RUN=deep$L STOP_AT=${STOP_AT:-1500} LAYERS=$L bash "$0" deep
      $PY scripts/training_curve.py --run runs/deep$L --after runs/onpolicy,runs/warm --out "$RES/deep$L/curve.jsonl" \
        --label deep$L "${CURVE[@]}" --steps "${STOP_AT:-1500}"
    done ;;
  ablate-scratch)  # depth from random weights: 2 layers against 1 (a control), the `fit` recipe and schedule, stopped at
                   # STOP_AT; τ at 1000 and STOP_AT
    for L in 2 1; do scratch_run "scratch$L" --layers "$L"; done ;;
  ablate-gamma)  # position weights exp(-(k-1)/GAMMA) (default 1: the loss on the first drafted positions) against the
                 # `scratch1` control (γ 4): otherwise the same run
    scratch_run "gamma${GAMMA:-1}" --gamma "${GAMMA:-1}" ;;
  deep)  # env: RUN, LAYERS, LAYER_IDS (fused target layers; 29, the last, is read from the stored final states),
         #      BLOCK (training block size), ANCHORS, LR, KL (weight of the KL term), DEEP_STEPS, DATA, STOP_AT
    $PY -m dflash train fit --data "${DATA:-data/tf1,data/tf-later}" --init-from runs/warm --layers "${LAYERS:-2}" \
      --layer-ids "${LAYER_IDS:-1,15,27}" --block-size "${BLOCK:-8}" --steps "${DEEP_STEPS:-6000}" --seqs-per-step 5 --anchors-per-seq "${ANCHORS:-16}" \
      --lr "${LR:-5e-4}" --kl-weight "${KL:-0}" \
      --partial-prob 0 --draft-vocab 8192 --threads "$THREADS" --ckpt-every 500 --eval-every 500 --snapshot-base 250 \
      --onpolicy-blocks 1 --out "runs/${RUN:-deep2}" --stop-at "${STOP_AT:-0}" ;;
  curve-deep)
    $PY scripts/training_curve.py --run "runs/${RUN:-deep2}" --after runs/onpolicy,runs/warm --out "$RES/${RUN:-deep2}/curve.jsonl" \
      --label "${RUN:-deep2}" "${CURVE[@]}" --steps "${CURVE_STEPS:-1000,2000,4000,6000}" ;;
  curve-warm)
    $PY scripts/training_curve.py --run runs/warm --after runs/onpolicy --out "$RES/warm/curve.jsonl" --label warm \
      "${CURVE[@]}" --steps "${CURVE_STEPS:-1000,4000,9000}" ;;
  plot)
    $PY scripts/training_curve.py --plot-only --out $RES/onpolicy/curve.jsonl $RES/warm/curve.jsonl $RES/${RUN:-deep2}/curve.jsonl \
      --png assets/draft-smollm2-135m/tau_curve.png ;;
  curve)
    $PY scripts/training_curve.py --run "runs/${RUN:-onpolicy}" --out "$RES/${RUN:-onpolicy}/curve.jsonl" --label "${RUN:-onpolicy}" \
      "${CURVE[@]}" --steps "${CURVE_STEPS:-250,1000,4000,8000,10000}" --png assets/draft-smollm2-135m/tau_curve.png ;;
  eval)  # the shipped draft with the real loop (interleaved with the no-draft loop where a speedup is reported)
    E=($PY -m dflash train eval --draft assets/draft-smollm2-135m --threads "$THREADS" --quiet)
    "${E[@]}" --prompts mt-bench --limit 80 --max-new-tokens 128 --output $RES/eval-mtbench.json
    "${E[@]}" --prompts humaneval --limit 80 --max-new-tokens 128 --no-baseline --output $RES/eval-humaneval.json
    "${E[@]}" --prompts mt-bench --limit 12 --max-new-tokens 64 --temperature 0.7 --output $RES/eval-mtbench-t0.7.json ;;
  collect)  # the logs TRAINING.md is generated from, and the chosen draft into assets/
    for r in tf-all onpolicy warm deep1 deep2 lowlr block4 kl last scratch1 scratch2 gamma1; do
      [ -d runs/$r ] || continue
      mkdir -p $RES/$r && cp runs/$r/runs.jsonl $RES/$r/ && gzip -c runs/$r/train_log.jsonl > $RES/$r/train_log.jsonl.gz
    done
    cp runs/${RUN:-warm}/{config.json,model.safetensors,draft_vocab.safetensors} assets/draft-smollm2-135m/ ;;
  copy-gap)  # each draft's first proposal against copying from the context (TRAINING.md: "Where the first proposal fails")
    drafts=(--draft shipped=assets/draft-smollm2-135m)
    for r in scratch1 scratch2; do for s in 2000 4000; do drafts+=(--draft "$r@$s=runs/$r/snapshots/step_00$s"); done; done
    $PY scripts/copy_gap.py --out $RES/copy-gap.jsonl "${CURVE[@]}" "${drafts[@]}"
    B=($PY -m dflash bench "${CURVE[@]}" --methods ar,dflash,dflash-lookup --dtype float32 --no-progress)
    "${B[@]}" --adaptive fixed --output $RES/lookup-fixed.json  # what copying adds (float32: exact; fixed blocks)
    "${B[@]}" --output $RES/lookup-auto.json ;;  # … with the default block policy
  report)
    $PY scripts/training_report.py ;;
  *) echo "usage: $0 data|data-later|data-long|data-later-long|ablate|fit|warm|ablate-depth|ablate-scratch|ablate-gamma|deep|curve|curve-warm|curve-deep|plot|copy-gap|collect|eval|report" >&2
     exit 2 ;;
esac
