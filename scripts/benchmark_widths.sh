#!/usr/bin/env bash
# Training throughput against fairseq 0.12.2 at the widths users train, on real Multi30k De->En
# batches: for each width the two programs run back to back, fairseq first, for ROUNDS rounds.
# Run it on an otherwise idle machine; only ratios from one run are comparable.
#
#   (cd ../shared/peers/fairseq && bash setup.sh && RECIPES=tiny UPDATES=20 bash bench.sh)  # venv, data
#   SEQ2SEQ_DATA_DIR=../shared/data bash scripts/benchmark_widths.sh
#
#   WIDTHS  recipes to time (default "tiny small iwslt big"): the shapes of fairseq's presets,
#           as scripts/benchmark_train.py's RECIPES has them (both programs read them there):
#             tiny   4+4 layers, d_model 128,  FFN 256,  4 heads, dropout 0.3 (Wu et al.)
#             small  3+3 layers, d_model 256,  FFN 512,  8 heads, dropout 0.1
#             iwslt  6+6 layers, d_model 512,  FFN 1024, 4 heads, dropout 0.3 (transformer_iwslt_de_en)
#             big    6+6 layers, d_model 1024, FFN 4096, 16 heads, dropout 0.3 (transformer_vaswani_wmt_en_de_big)
#   ROUNDS  rounds per width (default 1)
#   DTYPES  train.py's compute dtypes, each timed after fairseq (default "float32"; fairseq trains
#           in float32 on a CPU, its --bf16 being for TPUs)
#   OUT     folder for the logs and train.py's JSON reports (default /tmp/widths)
#   FS_VENV, FS_DATA, FS_THREADS as in bench.sh.
#
# Steps shrink with width so that each program takes a few minutes on 2 cores; both report the
# median of their log windows after the first. fairseq's flags are bench.sh's: shared embeddings,
# --max-tokens 4096, Adam (0.9, 0.98), inverse-sqrt warmup, label smoothing 0.1, no validation.
# One line per width, round and dtype: "WIDTH round N: fairseq wps A, train.py DTYPE B tok/s,
# B/A = R".
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FS_VENV:-/tmp/fsvenv2}"; BIN="${FS_DATA:-/tmp/fsdata}/m30k"; OUT="${OUT:-/tmp/widths}"
WIDTHS="${WIDTHS:-tiny small iwslt big}"; ROUNDS="${ROUNDS:-1}"; DTYPES="${DTYPES:-float32}"
[ -f "$BIN/dict.en.txt" ] || { echo "no fairseq data at $BIN: run ../shared/peers/fairseq/bench.sh once" >&2; exit 1; }
export OMP_NUM_THREADS="${FS_THREADS:-2}" MKL_NUM_THREADS="${FS_THREADS:-2}"
mkdir -p "$OUT"

steps_of() {  # steps and log interval per recipe: a few minutes of each program on 2 cores
  case $1 in
    tiny) echo "100 20" ;; small) echo "60 10" ;; iwslt) echo "24 4" ;; big) echo "8 2" ;;
    *) echo "unknown width recipe $1 (tiny, small, iwslt, big)" >&2; return 1 ;;
  esac
}
for r in $WIDTHS; do steps_of "$r" > /dev/null; done

shape_of() {  # the recipe's shape and optimizer as scripts/benchmark_train.py's RECIPES has them
  (cd "$REPO" && python -c "
import sys
from scripts.benchmark_train import RECIPES
model, optim = RECIPES[sys.argv[1]]['model'], RECIPES[sys.argv[1]]['optim']
print(model['num_encoder_layers'], model['d_model'], model['d_ff'], model['num_heads'],
      model['dropout_rate'], optim['learning_rate'], optim['warmup_steps'])" "$1")
}

for round in $(seq 1 "$ROUNDS"); do
  for r in $WIDTHS; do
    read -r layers dim ffn heads dropout lr warmup < <(shape_of "$r")
    read -r steps every < <(steps_of "$r")
    log="$OUT/fairseq_${r}_$round.log"
    "$VENV/bin/fairseq-train" "$BIN" --task translation --source-lang de --target-lang en \
      --arch transformer --encoder-layers "$layers" --decoder-layers "$layers" \
      --encoder-embed-dim "$dim" --decoder-embed-dim "$dim" --encoder-ffn-embed-dim "$ffn" \
      --decoder-ffn-embed-dim "$ffn" --encoder-attention-heads "$heads" --decoder-attention-heads "$heads" \
      --dropout "$dropout" --lr "$lr" --warmup-updates "$warmup" --share-all-embeddings \
      --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0 --lr-scheduler inverse_sqrt \
      --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 \
      --max-update "$steps" --log-interval "$every" --log-format simple --no-progress-bar --no-save \
      --save-dir "$OUT/ck" --cpu --num-workers 0 --seed 1 --disable-validation > "$log" 2>&1
    wps=$("$VENV/bin/python" - "$log" <<'PY'
import re, statistics, sys
w = [float(m.group(1)) for l in open(sys.argv[1]) if "train_inner" in l
     for m in [re.search(r"\bwps[= ](\d+(?:\.\d+)?)", l)] if m]
print(f"{statistics.median(w[1:] or w):.0f}")
PY
)
    for dtype in $DTYPES; do
      report="$OUT/train_${r}_${dtype}_$round.json"
      (cd "$REPO" && python -m scripts.benchmark_train --recipe="$r" --steps="$steps" \
         --log_every="$every" --dtype="$dtype" --out="$report" > "${report%.json}.log" 2>&1)
      ours=$(python -c "import json, sys; print(round(json.load(open(sys.argv[1]))['tokens_per_sec']))" "$report")
      echo "$r round $round: fairseq wps $wps, train.py $dtype $ours tok/s, B/A = $(python -c "print(f'{$ours / $wps:.2f}')")"
    done
  done
done
