#!/bin/bash
# The accelerator figures of docs/performance.md in one device call, most valuable first; a phase
# starts only with 60 s of LIMIT_S (default 540) to spare, and only if PHASES (default: all; names
# separated by commas) names it: all of them need ~10 minutes on an H200, more than one call can
# take. compile_warm, eval_cold and eval_warm need tiny_k1 in the same call. Each phase writes its
# JSON and log to $WORK (default /tmp/figures); figures.txt sums them up, and $OUT receives
# figures.txt and figures.tgz (the device call brings back only a few files):
#   tiny_k1     the tiny recipe, one run, one step per dispatch: target tokens/s and its
#               training shape compiled on a cold persistent cache. The tiny phases pack rows of
#               TINY_PACK (default 64) tokens: every Multi30k pair in one batch shape, so nothing
#               breaks a group of steps or the seeds' shared step, and one shape compiles
#               (the recipe's 32 gives three)
#   tiny_k8     the same with 8 steps per dispatch (train.steps_per_call), 16 of its steps traced
#               (train.profile_steps): the top operations, and the share of the traced time the
#               GPU was busy
#   seeds4      four seeds of it trained together (train.py --seeds), against tiny_k1; 10 steps
#               traced
#   seeds4_k8   the four seeds with 8 steps per dispatch, 16 steps traced
#   iwslt_bf16  the IWSLT-size step (6+6, d_model 512, FFN 1024) in bfloat16 at 1,024 x 32 tokens:
#               MFU, and the top operations of a jax.profiler trace
#   iwslt_bf16_chunks  the same with the loss's normaliser in chunks of 4,096 tokens
#               (train.loss_chunk_tokens): no [32k, 10k] float32 logits
#   compile_warm  tiny_k1's shapes again, on the now warm cache
#   compile_autotune0  tiny_k1 on a cold cache of its own with XLA's GPU autotuning off
#               (--xla_gpu_autotune_level=0): its compile time and step rate against tiny_k1's
#   eval        eval.py's whole process on test_2016 (beam 5), cold cache, then warm
# On the device machine, scripts/device_setup.sh installs the wheels and points at the data, both
# made on the CPU beforehand by `bash scripts/accelerator_figures.sh prepare`. A trial at a few
# steps on a CPU: SMALL=1 OUT=/tmp/figures_out bash scripts/accelerator_figures.sh
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = prepare ]; then
  # The packages the device image lacks, Multi30k's raw files and their prepared data, which both
  # directions share (one joint vocabulary).
  bash scripts/device_prepare.sh || exit 1
  exit
fi

OUT=${OUT:?set OUT to the folder the figures go to}; WORK=${WORK:-/tmp/figures}
mkdir -p "$OUT" "$WORK"
DEADLINE=$((SECONDS + ${LIMIT_S:-540}))
if [ -n "${SMALL:-}" ]; then
  TINY_STEPS=12; LOG=4; IWSLT=(--batch_size=8 --steps=2 --warmup=1); SEEDS=2
else
  TINY_STEPS=600; LOG=50; IWSLT=(--batch_size=1024 --steps=20 --warmup=3); SEEDS=4
fi
source scripts/device_setup.sh
command -v nvidia-smi > /dev/null && \
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$WORK/gpu.txt"
export JAX_COMPILATION_CACHE_DIR=/tmp/figures_xla

phase() {  # name, then the command; GPU busy sampled every 100 ms while it runs
  local name=$1; shift
  [[ ",${PHASES:-$name}," == *",$name,"* ]] || return
  if [ $SECONDS -gt $((DEADLINE - 60)) ]; then echo "$name: skipped, out of time" >> "$WORK/figures.txt"; return; fi
  local smi=
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "$WORK/$name.smi" &
    smi=$!
  fi
  local start=$SECONDS
  timeout $((DEADLINE - SECONDS)) "$@" > "$WORK/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s" >> "$WORK/times.txt"
  [ -n "$smi" ] && kill $smi
}
tiny() {  # name, then benchmark_train flags
  local name=$1; shift
  phase "$name" python3 -m scripts.benchmark_train --recipe=tiny --steps=$TINY_STEPS \
    --log_every=$LOG --pack_length="${TINY_PACK:-64}" --out="$WORK/$name.json" "$@"
}

# Cold caches, and no earlier run for tiny_k1 to resume.
rm -rf /tmp/figures_xla /tmp/figures_xla_autotune0 /tmp/figures_tiny_k1
tiny tiny_k1 --workdir=/tmp/figures_tiny_k1
tiny tiny_k8 --steps_per_call=8 --profile_steps=16
tiny seeds$SEEDS --seeds=$SEEDS --profile_steps=10
tiny seeds${SEEDS}_k8 --seeds=$SEEDS --steps_per_call=8 --profile_steps=16
phase iwslt_bf16 python3 -m scripts.benchmark --config=configs/iwslt14.py \
  --config.model.dtype=bfloat16 --source_length=32 --target_length=32 "${IWSLT[@]}" \
  --decode_repeats=1 --profile_dir=/tmp/figures_profile --out="$WORK/iwslt_bf16.json"
phase iwslt_bf16_chunks python3 -m scripts.benchmark --config=configs/iwslt14.py \
  --config.model.dtype=bfloat16 --config.train.loss_chunk_tokens=4096 --source_length=32 \
  --target_length=32 "${IWSLT[@]}" --decode_repeats=1 --out="$WORK/iwslt_bf16_chunks.json"
tiny compile_warm --steps=$((2 * LOG))
JAX_COMPILATION_CACHE_DIR=/tmp/figures_xla_autotune0 XLA_FLAGS="$XLA_FLAGS --xla_gpu_autotune_level=0" \
  tiny compile_autotune0 --steps=$((4 * LOG))
if [ -d /tmp/figures_tiny_k1/checkpoints ]; then
  for cache in cold warm; do
    JAX_COMPILATION_CACHE_DIR=/tmp/figures_xla_eval phase eval_$cache /usr/bin/time -f '%e s' \
      python3 eval.py --workdir=/tmp/figures_tiny_k1 --split=test_2016 --out_dir="$WORK/eval_$cache"
  done
fi
python3 - "$WORK" >> "$WORK/figures.txt" <<'EOF'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
def busy(name):
  samples = [float(line) for line in (out / f'{name}.smi').read_text().split() if line.strip()] \
      if (out / f'{name}.smi').exists() else []
  # Over the whole process, compiling included: a short phase's figure is mostly its compile.
  return f', GPU busy {statistics.mean(samples):.0f}% of the process' if samples else ''
for name in ('tiny_k1', 'tiny_k8', 'seeds2', 'seeds4', 'seeds2_k8', 'seeds4_k8', 'compile_warm',
             'compile_autotune0'):
  path = out / f'{name}.json'
  if path.exists():
    r = json.loads(path.read_text())
    print(f"{name}: {r['tokens_per_sec']:,.0f} target tokens/s (median window, {r.get('seeds', 1)} "
          f"seed(s)); {r['compiled_shapes']} shapes compiled in {r['compile_seconds']:.1f} s{busy(name)}; {r['device']}")
    if r.get('profile_top'):
      traced = r['profile_device_busy']
      print(f"  {r['profile_steps']} traced steps" + (
          f', device busy {traced:.1%} of the traced time' if traced is not None else '') + ':')
      for row in r['profile_top'][:8]:
        print(f"  {row['share']:6.1%}  {row['seconds'] * 1e3:9.2f} ms  {row['operation']}")
for name in ('iwslt_bf16', 'iwslt_bf16_chunks'):
  path = out / f'{name}.json'
  if path.exists():
    r = json.loads(path.read_text())
    mfu = f"MFU {100 * r['mfu']:.1f}%" if r.get('mfu') else 'no MFU (a CPU)'
    print(f"{name}: {r['train_step_seconds'] * 1e3:.1f} ms a step, {r['train_tokens_per_sec']:,.0f} "
          f"target tokens/s, {mfu}, compile {r['compile_seconds']:.1f} s, XLA scratch "
          f"{r['train_step_temp_mb'] or 0:,.0f} MB{busy(name)}")
    for row in r.get('profile_top') or []:
      print(f"  {row['share']:6.1%}  {row['seconds'] * 1e3:9.2f} ms  {row['operation']}")
for cache in ('cold', 'warm'):
  log = out / f'eval_{cache}.log'
  if log.exists():
    print(f'eval.py test_2016, {cache} cache: whole process {log.read_text().split()[-2]} s')
EOF
cp "$WORK/figures.txt" "$OUT/"
tar czf "$OUT/figures.tgz" --exclude='*.model' -C "$WORK" .
cat "$OUT/figures.txt"
