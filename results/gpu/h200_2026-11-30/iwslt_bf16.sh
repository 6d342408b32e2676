#!/bin/bash
# The IWSLT-size training step (6+6, d_model 512, FFN 1024) in bfloat16 at 1,024 x 32 tokens, with a
# jax.profiler trace, then with the loss's normaliser in chunks of 4,096 tokens; on the device as
# `OUT=$OUT bash results/gpu/h200_2026-11-30/iwslt_bf16.sh` (.whl/ carried).
source scripts/device_setup.sh
for c in none 4096; do
  extra=(); [ $c != none ] && extra=(--config.train.loss_chunk_tokens=$c)
  prof=(); [ $c = none ] && prof=(--profile_dir=/tmp/prof)
  s=$SECONDS
  timeout 110 python3 -m scripts.benchmark --config=configs/iwslt14.py --config.model.dtype=bfloat16 \
    --source_length=32 --target_length=32 --batch_size=${B:-1024} --steps=${N:-20} --warmup=3 \
    --decode_repeats=1 "${extra[@]}" "${prof[@]}" --out=$OUT/iwslt_bf16_$c.json > $OUT/iwslt_bf16_$c.log 2>&1
  echo "$c: exit $? after $((SECONDS - s)) s" | tee -a $OUT/times.txt
done
