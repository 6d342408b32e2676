#!/bin/bash
# One device call of under 10 minutes: the accelerator figures (scripts/accelerator_figures.sh, the
# phases that fit in FIGURES_S), then configs/sweeps/xiong2020.py:converge_key's 12 runs (Post-LN
# and Pre-LN x warmup {0, 4000} at peak 1e-3, seeds 0-2) trained at once, each point's seeds as one
# program with 8 steps per dispatch, until TOTAL_S; then each run's test_2016 BLEU. Where the
# figures saw seeds trained together or 8 steps per dispatch fail on the device, the runs train
# without them. Arguments go to every run. Needs .whl/ and .gpudata/ from
# `bash scripts/accelerator_figures.sh prepare`; run as `OUT=$OUT bash results/gpu/h200_2026-11-28/run.sh`.
# The records here: figures.txt, tiny_k1.json, tiny_k8.json and figures_times.txt from this script
# (in FIGURES_S=190 only tiny_k1 and tiny_k8 fitted: tiny_k1 compiled for 82 s); converge_key/
# from the sweep alone in a second call on the same machine, as
#   SPEC=configs/sweeps/xiong2020.py:converge_key WORKDIR=/tmp/converge DEADLINE_S=540 EVAL_S=80 \
#     bash scripts/sweep_on_one_gpu.sh --config.train.steps_per_call=8 --config.train.log_every=40 \
#     --config.train.eval_every=1200 --config.train.checkpoint_every=4000
# (this script's own sweep had stopped at once: scripts/sweep.py imports submitit, whose wheel
# the prepare step had not fetched). The runs stopped at the deadline, 1,208-1,328 steps in.
set -u
cd "$(dirname "$0")/../../.."
START=$SECONDS
OUT=${OUT:?set OUT to the folder the results go to}
LIMIT_S=${FIGURES_S:-190} bash scripts/accelerator_figures.sh
WORK=${WORK:-/tmp/figures}
together=1; grep -q "^seeds[0-9]*: exit [1-9]" "$WORK/times.txt" 2> /dev/null && together=0
k=8; grep -q "^tiny_k8: exit [1-9]" "$WORK/times.txt" 2> /dev/null && k=1
SPEC=configs/sweeps/xiong2020.py:converge_key WORKDIR=${CONVERGE:-/tmp/converge} OUT=$OUT \
  SEEDS_TOGETHER=$together POINTS=$([ $together = 1 ] && echo 4 || echo 12) EVAL_S=80 \
  DEADLINE_S=$((${TOTAL_S:-570} - (SECONDS - START))) bash scripts/sweep_on_one_gpu.sh \
  --config.train.steps_per_call=$k --config.train.log_every=40 --config.train.eval_every=1200 \
  --config.train.checkpoint_every=4000 "$@"
echo "seeds together: $together, steps per dispatch: $k"
cat "${CONVERGE:-/tmp/converge}/times.txt"
grep -h "stopped at\|finished at\|diverged" "${CONVERGE:-/tmp/converge}"/sweep_*.log
