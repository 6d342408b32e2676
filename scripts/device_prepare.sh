#!/bin/bash
# What the device scripts need (scripts/device_setup.sh), made on a CPU before a device call, from
# the repository root: the packages the device image lacks as Python 3.12 wheels in .whl/, and
# Multi30k with its prepared data, tokenizer and token ids in .gpudata/. Both folders are
# git-ignored (.git/info/exclude) and travel to the device machine with the working tree
# (`carry`). Its image brings jax 0.11.2 with CUDA, flax, optax, orbax, sentencepiece and sacrebleu.
# `bash scripts/accelerator_figures.sh prepare` runs it. The prepared data and joint vocabulary
# serve both directions: a De->En run adds nothing to the cache.
set -euo pipefail
grep -qx /.whl/ .git/info/exclude 2> /dev/null || printf '/.whl/\n/.gpudata/\n' >> .git/info/exclude
wheels() {
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "$@"
}
# requirements.txt's pins the image lacks or holds at other versions, then their own needs.
wheels flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8 grain==0.2.18 \
  tensorflow-datasets==4.9.10 array_record==0.8.6 sentencepiece==0.2.3 sacrebleu==2.6.0 \
  sacremoses==0.2.0 ml_collections==1.1.0 tensorboardX==2.6.5 submitit==1.5.4
wheels dm-tree==0.1.10 immutabledict nest-asyncio portpicker simple-parsing \
  tensorflow-metadata==1.21.0 termcolor toml docstring-parser googleapis-common-protos
python3 -m pip wheel --no-deps -w .whl promise  # tensorflow-datasets needs it; no wheel is published
# The data, and its cache prepared by a 2-step run (the run itself is thrown away).
mkdir -p .gpudata/data && cp -r ../shared/data/multi30k .gpudata/data/
SEQ2SEQ_DATA_DIR=$PWD/.gpudata/data CI=1 python train.py --config=configs/multi30k.py:en_de \
  --workdir=/tmp/gpu_prepare_run --config.data.cache_dir="$PWD/.gpudata/cache" \
  --config.train.num_steps=2 --config.optim.warmup_steps=1 --config.train.time_budget_minutes=0 \
  --config.train.eval_every=2 --config.data.eval_examples=8
rm -rf .gpudata/cache/xla /tmp/gpu_prepare_run  # this CPU's compiled programs are of no use there
