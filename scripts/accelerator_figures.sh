#!/bin/bash
# The accelerator figures of docs/performance.md in one device call of under 10 minutes, most
# valuable first; each phase writes its JSON and log to $OUT, and $OUT/figures.txt sums them up:
#   tiny_k1     the tiny recipe, one run, one step per dispatch: target tokens/s, GPU busy
#   seeds4      four seeds of it trained together (train.py --seeds), against tiny_k1
#   iwslt_bf16  the IWSLT-size step (6+6, d_model 512, FFN 1024) in bfloat16 at 1,024 x 32 tokens:
#               MFU, and the top operations of a jax.profiler trace
#   tiny_k8     the tiny run with 8 steps per dispatch (train.steps_per_call)
#   compile     the tiny run's training shapes compiled on a cold persistent cache, then warm
#   eval        eval.py's whole process on test_2016 (beam 5), cold cache, then warm
# On the device machine it installs the wheels in .whl/ and reads Multi30k from .gpudata/, both
# made on the CPU beforehand by `bash scripts/accelerator_figures.sh prepare`. A trial at a few
# steps on a CPU: SMALL=1 OUT=/tmp/figures bash scripts/accelerator_figures.sh
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = prepare ]; then
  # The packages the device image lacks (results/gpu/h200_2026-11-27/prepare.sh lists them) and
  # Multi30k's raw files with the De->En preset's prepared data and vocabulary.
  [ -d .whl ] || bash results/gpu/h200_2026-11-27/prepare.sh
  SEQ2SEQ_DATA_DIR=$PWD/.gpudata/data CI=1 python train.py --config=configs/multi30k.py:de_en \
    --workdir=/tmp/figures_prepare_run --config.data.cache_dir="$PWD/.gpudata/cache" \
    --config.train.num_steps=2 --config.optim.warmup_steps=1 --config.train.time_budget_minutes=0 \
    --config.train.eval_every=2 --config.data.eval_examples=8 > /dev/null
  rm -rf .gpudata/cache/xla /tmp/figures_prepare_run
  exit
fi

OUT=${OUT:?set OUT to the folder the figures go to}; mkdir -p "$OUT"
DEADLINE=$((SECONDS + ${LIMIT_S:-540}))  # a phase starts only with 60 s or more to spare
if [ -n "${SMALL:-}" ]; then
  TINY_STEPS=12; LOG=4; IWSLT=(--batch_size=8 --steps=2 --warmup=1); SEEDS=2
else
  TINY_STEPS=600; LOG=50; IWSLT=(--batch_size=1024 --steps=20 --warmup=3); SEEDS=4
fi
if command -v nvidia-smi > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
fi
if [ -d .gpudata ]; then
  export SEQ2SEQ_DATA_DIR=$PWD/.gpudata/data
  mkdir -p ~/.cache && { [ -e ~/.cache/seq2seq_lab ] || cp -r .gpudata/cache ~/.cache/seq2seq_lab; }
fi
# Float32 products as on a CPU; cuBLAS GEMMs (Triton's autotuning compiles for over a minute);
# no up-front claim of the GPU's memory.
export CI=1 PYTHONUNBUFFERED=1 JAX_DEFAULT_MATMUL_PRECISION=highest \
  XLA_FLAGS=--xla_gpu_enable_triton_gemm=false XLA_PYTHON_CLIENT_PREALLOCATE=false \
  JAX_COMPILATION_CACHE_DIR=/tmp/figures_xla

phase() {  # name, then the command; GPU busy sampled every 100 ms while it runs
  local name=$1; shift
  if [ $SECONDS -gt $((DEADLINE - 60)) ]; then echo "$name: skipped, out of time" >> "$OUT/figures.txt"; return; fi
  local smi=
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "$OUT/$name.smi" &
    smi=$!
  fi
  local start=$SECONDS
  timeout $((DEADLINE - SECONDS)) "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s" >> "$OUT/times.txt"
  [ -n "$smi" ] && kill $smi
}
tiny() {  # name, then benchmark_train flags
  local name=$1; shift
  phase "$name" python3 -m scripts.benchmark_train --recipe=tiny --steps=$TINY_STEPS \
    --log_every=$LOG --out="$OUT/$name.json" "$@"
}

rm -rf /tmp/figures_xla
tiny tiny_k1 --workdir=/tmp/figures_tiny_k1
tiny seeds$SEEDS --seeds=$SEEDS
phase iwslt_bf16 python3 -m scripts.benchmark --config=configs/iwslt14.py \
  --config.model.dtype=bfloat16 --source_length=32 --target_length=32 "${IWSLT[@]}" \
  --decode_repeats=1 --profile_dir=/tmp/figures_profile --out="$OUT/iwslt_bf16.json"
tiny tiny_k8 --steps_per_call=8
JAX_COMPILATION_CACHE_DIR=/tmp/figures_xla_cold tiny compile_cold --steps=$((2 * LOG))
JAX_COMPILATION_CACHE_DIR=/tmp/figures_xla_cold tiny compile_warm --steps=$((2 * LOG))
if [ -d /tmp/figures_tiny_k1/checkpoints ]; then
  for cache in cold warm; do
    JAX_COMPILATION_CACHE_DIR=/tmp/figures_xla_eval phase eval_$cache /usr/bin/time -f '%e s' \
      python3 eval.py --workdir=/tmp/figures_tiny_k1 --split=test_2016 --out_dir="$OUT/eval_$cache"
  done
fi
python3 - "$OUT" >> "$OUT/figures.txt" <<'EOF'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
def busy(name):
  samples = [float(line) for line in (out / f'{name}.smi').read_text().split() if line.strip()] \
      if (out / f'{name}.smi').exists() else []
  return f', GPU busy {statistics.mean(samples):.0f}% (median {statistics.median(samples):.0f}%)' if samples else ''
for name in ('tiny_k1', 'seeds2', 'seeds4', 'tiny_k8', 'compile_cold', 'compile_warm'):
  path = out / f'{name}.json'
  if path.exists():
    r = json.loads(path.read_text())
    print(f"{name}: {r['tokens_per_sec']:,.0f} target tokens/s (median window, {r.get('seeds', 1)} "
          f"seed(s)); {r['compiled_shapes']} shapes compiled in {r['compile_seconds']:.1f} s{busy(name)}; {r['device']}")
path = out / 'iwslt_bf16.json'
if path.exists():
  r = json.loads(path.read_text())
  mfu = f"MFU {100 * r['mfu']:.1f}%" if r.get('mfu') else 'no MFU (a CPU)'
  print(f"iwslt_bf16: {r['train_step_seconds'] * 1e3:.1f} ms a step, {r['train_tokens_per_sec']:,.0f} "
        f"target tokens/s, {mfu}, compile {r['compile_seconds']:.1f} s{busy('iwslt_bf16')}")
  for row in r.get('profile_top') or []:
    print(f"  {row['share']:6.1%}  {row['seconds'] * 1e3:9.2f} ms  {row['operation']}")
for cache in ('cold', 'warm'):
  log = out / f'eval_{cache}.log'
  if log.exists():
    print(f'eval.py test_2016, {cache} cache: whole process {log.read_text().split()[-2]} s')
EOF
cat "$OUT/figures.txt"
