#!/bin/bash
# En->De's hour recipe (configs/multi30k.py:en_de) at twice the preset's 9,600 steps, seeds 0 and
# 1, on one GPU; then eval.py's beam 5 on validation and the three test sets. Two questions:
# - Do steps past 9,600 reach Wu et al.'s 41.02 on test_2016?
# - Did the step rate halve after step 400 because four runs shared the GPU? Seed 0 starts alone
#   and seed 1 joins once seed 0 has logged step STAGGER, so seed 0's own log shows its rate
#   alone (after its first validation and checkpoints) and then beside another run.
# Seed 0's evaluations use eval.py's default --smallest_batch (8), seed 1's --smallest_batch=64,
# to time the beam search's compilation both ways on the same machine.
# ALONE_SEED=N trains and evaluates seed N alone instead (--smallest_batch=64).
# Needs .whl/ and .gpudata/ from scripts/device_prepare.sh. Ran on 2026-11-27 as
# `bash results/gpu/h200_2026-11-27_long/run.sh`, then `ALONE_SEED=2 BUDGET=4.5 bash ...` (same file).
set -u
OUT=${OUT:-/tmp/gpu_out}; R=${R:-/tmp/r}; mkdir -p "$OUT" "$R"
STEPS=${STEPS:-19200}; STAGGER=${STAGGER:-1200}; BUDGET=${BUDGET:-6.0}
SPLITS=${SPLITS:-validation test_2016 test_2017 test_mscoco_2017}
EXTRA=${EXTRA:-}  # more train.py flags, for a trial run on a CPU
if command -v nvidia-smi >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi > "$R/nvidia-smi.txt"
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 2 \
    > "$R/smi.csv" 2>&1 &
  smi=$!
fi
# As in h200_2026-11-27/run.sh: float32 products as on a CPU, cuBLAS GEMMs, no up-front memory claim.
export SEQ2SEQ_DATA_DIR=$PWD/.gpudata/data PYTHONUNBUFFERED=1 CI=1 \
  JAX_DEFAULT_MATMUL_PRECISION=highest XLA_FLAGS=--xla_gpu_enable_triton_gemm=false \
  XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -c "import jax, flax, optax, grain; print(jax.__version__, flax.__version__, jax.devices())" \
  > "$R/versions.txt" 2>&1

pack() {
  tar czf "$OUT/tmp.tgz" --exclude=checkpoints --exclude='tokenizer*.model' --exclude='events.*' \
    --exclude=run.lock -C "$R" . && mv "$OUT/tmp.tgz" "$OUT/results.tgz"
}

train_and_eval() {  # name, eval.py's --smallest_batch, then train.py flags
  local name=$1 smallest=$2; shift 2
  echo "$name start $(date -u +%T)" >> "$R/times.txt"
  python3 train.py --config=configs/multi30k.py:en_de --workdir="$R/$name" \
    --config.data.cache_dir="$PWD/.gpudata/cache" --config.train.time_budget_minutes="$BUDGET" \
    --config.train.num_steps="$STEPS" --config.train.eval_every=$((STEPS / 4)) $EXTRA "$@" \
    > "$R/$name.train.log" 2>&1
  echo "$name trained $(date -u +%T)" >> "$R/times.txt"
  for split in $SPLITS; do
    /usr/bin/time -f "$name $split %e s" -a -o "$R/eval_times.txt" python3 eval.py \
      --workdir="$R/$name" --split="$split" --smallest_batch="$smallest" \
      > "$R/$name.$split.log" 2>&1 &
  done
  wait
  echo "$name evaluated $(date -u +%T)" >> "$R/times.txt"
}

(while sleep 15; do pack; done) &
packer=$!
if [ -n "${ALONE_SEED:-}" ]; then  # one more seed, alone on the GPU
  # In the background: its `wait` would wait for the packer too.
  train_and_eval "s$ALONE_SEED" 64 --config.train.seed="$ALONE_SEED" &
  wait $!
else
  train_and_eval s0 8 --config.train.seed=0 &
  first=$!
  until grep -q "\"step\": $STAGGER," "$R/s0/metrics.jsonl" 2>/dev/null; do
    kill -0 $first 2>/dev/null || break
    sleep 1
  done
  echo "s0 logged step $STAGGER $(date -u +%T)" >> "$R/times.txt"
  train_and_eval s1 64 --config.train.seed=1 &
  second=$!
  wait $first $second
fi
kill $packer ${smi:-}
pack
echo done
