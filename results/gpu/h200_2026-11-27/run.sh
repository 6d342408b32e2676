#!/bin/bash
# En->De's hour recipe (configs/multi30k.py:en_de) past the steps a CPU hour buys, on one GPU:
# seeds 0-2 with up to LONG steps and seed 0 with the preset's 9,600, all four at once, each run
# planning its steps to fit BUDGET minutes (train.time_budget_minutes), then eval.py's beam 5 on
# validation and the three test sets. Run from the repository root on the device machine, with the
# Python 3.12 wheels in .whl/ and Multi30k plus its prepared cache in .gpudata/ (scripts/device_prepare.sh).
# Ran on 2026-11-27 as `LONG=28800 BUDGET=5.5 bash results/gpu/h200_2026-11-27/run.sh`.
set -u
OUT=${OUT:-/tmp/gpu_out}; R=${R:-/tmp/r}; mkdir -p "$OUT" "$R"
BUDGET=${BUDGET:-5.5}; LONG=${LONG:-19200}; SHORT=${SHORT:-9600}; EXTRA=${EXTRA:-}
SPLITS=${SPLITS:-validation test_2016 test_2017 test_mscoco_2017}
if command -v nvidia-smi >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi > "$R/nvidia-smi.txt"
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 10 \
    > "$R/smi.csv" 2>&1 &
  smi=$!
fi
# float32 products as on a CPU (not TF32); cuBLAS instead of autotuned Triton GEMMs, whose
# compilation took 25-40 s a shape on 2026-11-25; no up-front claim on the GPU's memory, which
# four training and sixteen eval processes share.
export SEQ2SEQ_DATA_DIR=$PWD/.gpudata/data PYTHONUNBUFFERED=1 CI=1 \
  JAX_DEFAULT_MATMUL_PRECISION=highest XLA_FLAGS=--xla_gpu_enable_triton_gemm=false \
  XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -c "import jax, flax, optax, grain; print(jax.__version__, flax.__version__, jax.devices())" \
  > "$R/versions.txt" 2>&1

pack() {
  tar czf "$OUT/tmp.tgz" --exclude=checkpoints --exclude=tokenizer.model --exclude='events.*' \
    --exclude=run.lock -C "$R" . && mv "$OUT/tmp.tgz" "$OUT/results.tgz"
}

train_and_eval() {  # name, then train.py flags
  local name=$1; shift
  echo "$name start $(date -u +%T)" >> "$R/times.txt"
  python3 train.py --config=configs/multi30k.py:en_de --workdir="$R/$name" \
    --config.data.cache_dir="$PWD/.gpudata/cache" --config.train.time_budget_minutes="$BUDGET" \
    $EXTRA "$@" > "$R/$name.train.log" 2>&1
  echo "$name trained $(date -u +%T)" >> "$R/times.txt"
  for split in $SPLITS; do
    python3 eval.py --workdir="$R/$name" --split="$split" > "$R/$name.$split.log" 2>&1 &
  done
  wait
  echo "$name evaluated $(date -u +%T)" >> "$R/times.txt"
}

(while sleep 20; do pack; done) &
packer=$!
pids=()
for seed in 0 1 2; do
  train_and_eval "s${seed}_long" --config.train.seed=$seed --config.train.num_steps="$LONG" \
    --config.train.eval_every=$((LONG / 4)) &
  pids+=($!)
done
train_and_eval s0_preset --config.train.num_steps="$SHORT" --config.train.eval_every=$((SHORT / 4)) &
pids+=($!)
wait "${pids[@]}"
# Both loops would hold a caller's pipe open, and the call with it (it did on 2026-11-27).
kill $packer ${smi:-}
pack
echo done
