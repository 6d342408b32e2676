#!/bin/bash
# One device call of under 10 minutes. First configs/sweeps/xiong2020.py:converge_key's runs
# without warmup (Post-LN and Pre-LN at peak 1e-3, seeds 0-2) towards 12,000 steps, each
# placement's seeds one program with 8 steps per dispatch, every pair packed into rows of 64
# tokens (one batch shape), TF32 products (float32 everywhere else) until SWEEP_S; then each
# run's test_2016 BLEU. Then the accelerator figures (scripts/accelerator_figures.sh, float32
# products) in what is left of TOTAL_S. Needs .whl/ and .gpudata/ from
# `bash scripts/accelerator_figures.sh prepare`; run as `OUT=$OUT bash results/gpu/h200_2026-11-30/run.sh`.
# Arguments go to every training run.
# The records here, from one call of 522 s on one NVIDIA H200 (TOTAL_S=560 SWEEP_S=330):
# converge_key_warmup0/ (the runs stopped at the deadline, 2,984-3,008 steps in), then
# figures.txt, tiny_k1.json, tiny_k8.json, seeds4.json and figures_times.txt (the IWSLT-size,
# compile-warm and eval.py phases did not fit; iwslt_bf16.sh measured the first in a second call).
set -u
cd "$(dirname "$0")/../../.."
START=$SECONDS
OUT=${OUT:?set OUT to the folder the results go to}
CONVERGE=${CONVERGE:-/tmp/converge}
JAX_DEFAULT_MATMUL_PRECISION=tensorfloat32 SPEC=configs/sweeps/xiong2020.py:converge_key \
  WORKDIR=$CONVERGE OUT=$OUT EVAL_S=${EVAL_S:-60} DEADLINE_S=${SWEEP_S:-330} \
  bash scripts/sweep_on_one_gpu.sh --only=warmup=0, --config.data.pack_length=64 \
  --config.train.steps_per_call=8 --config.train.log_every=40 --config.train.eval_every=1200 \
  --config.train.checkpoint_every=4000 "$@"
cat "$CONVERGE/times.txt"
grep -h "stopped at\|finished at\|diverged" "$CONVERGE"/sweep_*.log
LIMIT_S=$((${TOTAL_S:-565} - (SECONDS - START))) bash scripts/accelerator_figures.sh
