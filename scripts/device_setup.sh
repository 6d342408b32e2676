# Sourced by the scripts that run on a lent accelerator (accelerator_figures.sh, sweep_on_one_gpu.sh),
# from the repository root. On a machine with an NVIDIA GPU it installs the wheels in .whl/; with
# .gpudata/ it reads Multi30k and its prepared data from there. Both are made on a CPU beforehand by
# `bash scripts/accelerator_figures.sh prepare`. Then the settings every GPU figure in the docs was
# measured with: float32 products as on a CPU, unless JAX_DEFAULT_MATMUL_PRECISION is set before
# (tensorfloat32: TF32 tensor-core products, float32 everywhere else); cuBLAS GEMMs (Triton's
# autotuning compiles for over a minute); no up-front claim of the GPU's memory, so that several
# processes share it.
if command -v nvidia-smi > /dev/null; then
  # Installed once per machine, and again when .whl/ holds other wheels than those installed.
  wheels=$(ls .whl | md5sum)
  if [ "$(cat /tmp/site/.wheels 2> /dev/null)" != "$wheels" ]; then
    rm -rf /tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
    echo "$wheels" > /tmp/site/.wheels
  fi
  export PYTHONPATH=/tmp/site:$PWD
fi
if [ -d .gpudata ]; then
  export SEQ2SEQ_DATA_DIR=$PWD/.gpudata/data
  mkdir -p ~/.cache && { [ -e ~/.cache/seq2seq_lab ] || cp -r .gpudata/cache ~/.cache/seq2seq_lab; }
fi
export CI=1 PYTHONUNBUFFERED=1 JAX_DEFAULT_MATMUL_PRECISION=${JAX_DEFAULT_MATMUL_PRECISION:-highest} \
  XLA_FLAGS=--xla_gpu_enable_triton_gemm=false XLA_PYTHON_CLIENT_PREALLOCATE=false
