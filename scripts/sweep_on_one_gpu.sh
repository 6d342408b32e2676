#!/bin/bash
# A sweep's runs trained at the same time on one accelerator, each group of runs that differ only
# in seed, peak rate and warmup as one program, until a deadline; then every run's test BLEU, and
# the run records packed into $OUT/sweep.tgz.
#   SPEC=configs/sweeps/xiong2020.py:converge_key WORKDIR=/tmp/converge OUT=/tmp/out \
#     DEADLINE_S=540 bash scripts/sweep_on_one_gpu.sh --config.train.steps_per_call=8
# Arguments after the variables go to every run (scripts/sweep.py's --config.KEY=VALUE, --only).
# Members together and several steps per dispatch pay only with one batch shape: for Multi30k,
# --config.data.pack_length=64 (its max_length) gives one (docs/performance.md, "Compiling").
# The groups run as POINTS processes of scripts/sweep.py --together --num_hosts=POINTS, one group
# each (a small model leaves a GPU idle between steps; several programs fill it): converge_key has
# two (Post-LN, Pre-LN), each of 2 warmups x 3 seeds. TOGETHER=0 drops --together: each process
# then trains its share of the runs in turn (POINTS=12 for converge_key's 12 runs at once).
# EVAL_S (default 75) before DEADLINE_S they get SIGTERM: every run saves a checkpoint and says
# where it stopped, and the same command resumes them. Then eval.py on SPLIT (default test_2016, beam 5) for every run with a checkpoint, all at
# once. The pack leaves out checkpoints and tokenizers, and is refreshed every minute, so a call
# cut short still brings back what was logged.
set -u
cd "$(dirname "$0")/.."
SPEC=${SPEC:?set SPEC to a sweep, e.g. configs/sweeps/xiong2020.py:converge_key}
WORKDIR=${WORKDIR:?set WORKDIR to the sweep folder}; OUT=${OUT:?set OUT to the folder the pack goes to}
POINTS=${POINTS:-2}; EVAL_S=${EVAL_S:-75}; SPLIT=${SPLIT:-test_2016}
TOGETHER_FLAG=$([ "${TOGETHER:-1}" = 1 ] && echo --together)
DEADLINE=$((SECONDS + ${DEADLINE_S:-540}))
mkdir -p "$WORKDIR" "$OUT"
source scripts/device_setup.sh

pack() {
  tar czf "$OUT/sweep.tmp.tgz" --exclude=checkpoints --exclude='tokenizer*.model' \
    --exclude='events.*' --exclude=run.lock -C "$WORKDIR" . && mv "$OUT/sweep.tmp.tgz" "$OUT/sweep.tgz"
}
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 \
    > "$WORKDIR/smi.csv" 2>&1 &
  smi=$!
fi
sweeps=()
for host in $(seq 0 $((POINTS - 1))); do
  python3 -m scripts.sweep "$SPEC" --workdir="$WORKDIR" $TOGETHER_FLAG --num_hosts="$POINTS" \
    --host_index="$host" "$@" >> "$WORKDIR/sweep_$host.log" 2>&1 &
  sweeps+=($!)
done
echo "$(date -u +%T) started $POINTS sweep processes" >> "$WORKDIR/times.txt"
until [ $SECONDS -ge $((DEADLINE - EVAL_S)) ]; do
  running=0
  for pid in "${sweeps[@]}"; do kill -0 "$pid" 2> /dev/null && running=1; done
  [ $running = 0 ] && break
  sleep 5
  [ $((SECONDS % 60)) -lt 5 ] && pack
done
kill -TERM "${sweeps[@]}" 2> /dev/null
wait "${sweeps[@]}"
echo "$(date -u +%T) training stopped" >> "$WORKDIR/times.txt"
pack
evals=()
for run in "$WORKDIR"/*/; do
  [ -d "$run/checkpoints" ] || continue
  timeout $((DEADLINE - SECONDS > 5 ? DEADLINE - SECONDS - 5 : 1)) /usr/bin/time -f "${run%/} %e s" \
    -a -o "$WORKDIR/eval_times.txt" python3 eval.py --workdir="$run" --split="$SPLIT" \
    > "$run/eval_$SPLIT.log" 2>&1 &
  evals+=($!)
done
[ ${#evals[@]} -gt 0 ] && wait "${evals[@]}"
echo "$(date -u +%T) evaluated" >> "$WORKDIR/times.txt"
[ -n "${smi:-}" ] && kill "$smi"
pack
