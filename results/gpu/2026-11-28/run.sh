#!/bin/bash
# One device call of under 10 minutes: the accelerator figures (scripts/accelerator_figures.sh, the
# phases that fit in FIGURES_S), then configs/sweeps/xiong2020.py:converge_key's 12 runs (Post-LN
# and Pre-LN x warmup {0, 4000} at peak 1e-3, seeds 0-2) trained at once, each point's seeds as one
# program with 8 steps per dispatch, until TOTAL_S; then each run's test_2016 BLEU. Where the
# figures found seeds trained together or 8 steps per dispatch failing on the device, the runs
# train without them. Arguments go to every run. Needs .whl/ and .gpudata/ from
# `bash scripts/accelerator_figures.sh prepare`; ran as `OUT=$OUT bash results/gpu/2026-11-28/run.sh`.
set -u
cd "$(dirname "$0")/../../.."
START=$SECONDS
OUT=${OUT:?set OUT to the folder the results go to}
LIMIT_S=${FIGURES_S:-190} bash scripts/accelerator_figures.sh
WORK=${WORK:-/tmp/figures}
together=1; grep -q "^seeds[0-9]*: exit 0" "$WORK/times.txt" 2> /dev/null || together=0
k=8; grep -q "^tiny_k8: exit 0" "$WORK/times.txt" 2> /dev/null || k=1
SPEC=configs/sweeps/xiong2020.py:converge_key WORKDIR=${CONVERGE:-/tmp/converge} OUT=$OUT \
  SEEDS_TOGETHER=$together POINTS=$([ $together = 1 ] && echo 4 || echo 12) EVAL_S=80 \
  DEADLINE_S=$((${TOTAL_S:-570} - (SECONDS - START))) bash scripts/sweep_on_one_gpu.sh \
  --config.train.steps_per_call=$k --config.train.log_every=40 --config.train.eval_every=1200 \
  --config.train.checkpoint_every=4000 "$@"
echo "seeds together: $together, steps per dispatch: $k"
cat "${CONVERGE:-/tmp/converge}/times.txt"
grep -h "stopped at\|finished at\|diverged" "${CONVERGE:-/tmp/converge}"/sweep_*.log
