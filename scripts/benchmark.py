"""Training and decoding speed of a config's model on fixed synthetic batches.

  python -m scripts.benchmark --config=configs/multi30k.py:de_en_small --out=/tmp/bench.json
  python -m scripts.benchmark --config=configs/multi30k.py:de_en_small --config.model.d_ff=512 \
      --config.model.num_heads=8 --vocab_size=10000 --batch_size=256 --source_length=16 \
      --target_length=16 --out=/tmp/bench.json      # the shape scripts/benchmark_torch.py runs

Every token of the synthetic batches is real (no padding), so tokens/s counts useful work.
Compilation is timed apart (`compile_seconds`, once per function) and excluded from step times;
step times are medians over `--steps` after `--warmup` steps. Decoding generates exactly
`--target_length` tokens per sentence (the length limit is fixed there and a randomly initialised
model rarely stops earlier), so sentences/s is per that length. On a CPU the report gives the
achieved matmul GFLOP/s beside what this machine's XLA reaches on a plain 2048^2 matmul; on an
accelerator, device memory and MFU against the chip's peak (`--peak_tflops`, else a table).
This is a benchmark, not a test: nothing here asserts a speed.
"""

import functools
import json
from pathlib import Path
import resource
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from data import tokenizer as tokenizer_lib
from model import flops as flops_lib
from model import translate as translate_lib
from model.transformer import Transformer
from scripts import profile_summary
from scripts.timing import cpu_matmul_gflops, median_seconds
from training import command_line, run_log, train_state
from training.optimizer import make_optimizer

command_line.define_config_flag()
OUT = flags.DEFINE_string('out', None, 'Write the measurements here as JSON.')
VOCAB_SIZE = flags.DEFINE_integer('vocab_size', None, 'Vocabulary size (default config.data.vocab_size).')
BATCH_SIZE = flags.DEFINE_integer('batch_size', 256, 'Sentences per training batch.')
SOURCE_LENGTH = flags.DEFINE_integer('source_length', 16, 'Source tokens per sentence.')
TARGET_LENGTH = flags.DEFINE_integer('target_length', 16, 'Target tokens per sentence (and decoded).')
STEPS = flags.DEFINE_integer('steps', 10, 'Timed training steps.')
WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed training steps after compilation.')
DECODE_BATCH_SIZE = flags.DEFINE_integer('decode_batch_size', 128, 'Sentences per decoding batch.')
DECODE_REPEATS = flags.DEFINE_integer('decode_repeats', 3, 'Timed decoding calls (median taken).')
BEAM_SIZE = flags.DEFINE_integer('beam_size', 5, 'Beam size of the beam-search measurement.')
PROFILE_DIR = flags.DEFINE_string('profile_dir', None, 'Trace 5 more training steps with jax.profiler '
                                  'here and report their top operations (scripts/profile_summary.py).')
PEAK_TFLOPS = flags.DEFINE_float('peak_tflops', None, 'Accelerator peak TFLOP/s for MFU '
                                 '(default: a table by device kind and dtype).')

# Dense peak TFLOP/s from the vendors' data sheets, by (device kind prefix, compute dtype).
PEAK_TFLOPS_TABLE = {
    ('NVIDIA H100', 'bfloat16'): 989.0, ('NVIDIA H100', 'float32'): 494.0,  # float32 as TF32
    ('NVIDIA H200', 'bfloat16'): 989.0, ('NVIDIA H200', 'float32'): 494.0,
    ('NVIDIA A100', 'bfloat16'): 312.0, ('NVIDIA A100', 'float32'): 156.0,
    ('TPU v4', 'bfloat16'): 275.0, ('TPU v5e', 'bfloat16'): 197.0, ('TPU v5p', 'bfloat16'): 459.0,
}


def synthetic_batch(batch_size: int, source_length: int, target_length: int, vocab_size: int,
                    seed: int = 0) -> dict[str, np.ndarray]:
  """EOS-terminated random sentences with no padding, in the training feature layout."""
  rng = np.random.default_rng(seed)
  words = lambda length: rng.integers(tokenizer_lib.UNK_ID + 1, vocab_size, (batch_size, length))
  source = words(source_length)
  source[:, -1] = tokenizer_lib.EOS_ID
  target = words(target_length)
  target[:, -1] = tokenizer_lib.EOS_ID
  decoder_input = np.concatenate([np.full((batch_size, 1), tokenizer_lib.BOS_ID), target[:, :-1]], 1)
  return {'encoder_input_tokens': source.astype(np.int32),  # [B, S]
          'decoder_input_tokens': decoder_input.astype(np.int32),  # [B, T]
          'decoder_target_tokens': target.astype(np.int32),  # [B, T]
          'decoder_target_weights': np.ones((batch_size, target_length), np.float32)}


def _compiled(jitted, *args):
  """(compiled executable, seconds to lower and compile)."""
  start = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  return compiled, time.perf_counter() - start


def benchmark_training(config, vocab_size: int, batch_size: int, source_length: int,
                       target_length: int, steps: int, warmup: int,
                       profile_dir: str | None = None) -> dict:
  model = Transformer.of(config.model, vocab_size)
  tx, _ = make_optimizer(config.optim, steps_per_epoch=1000, total_steps=max(config.train.num_steps, 1))
  state = train_state.create_train_state(model, tx, config.train.seed)
  batch = jax.device_put(synthetic_batch(batch_size, source_length, target_length, vocab_size))
  step_fn = jax.jit(functools.partial(
      train_state.train_step, model=model, tx=tx, label_smoothing=config.train.label_smoothing,
      dropout_key=jax.random.PRNGKey(1), microbatch_tokens=train_state.microbatch_tokens(config),
      loss_chunk_tokens=config.train.loss_chunk_tokens), donate_argnums=0)
  compiled, compile_seconds = _compiled(step_fn, state, batch)
  # XLA's plan of the step's scratch memory (activations, logits, gradients in flight), exact and
  # the same on every run, where device peaks depend on the allocator.
  memory = compiled.memory_analysis()
  temp_mb = memory.temp_size_in_bytes / 2**20 if memory is not None else None
  for _ in range(warmup):
    state, metrics = compiled(state, batch)
  jax.block_until_ready(state)
  step_times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    step_times.append(time.perf_counter() - start)
  step_seconds = statistics.median(step_times)
  profile = None
  if profile_dir:
    with jax.profiler.trace(profile_dir, create_perfetto_trace=True):
      for _ in range(5):
        state, metrics = compiled(state, batch)
      jax.block_until_ready(metrics)
    profile = [{'operation': name, 'seconds': seconds, 'share': share} for name, seconds, share
               in profile_summary.top_operations(profile_summary.read_events(profile_dir), 15)]
  return {'profile_top': profile, 'model': model,
          'variables': train_state.model_variables(state.params, state.batch_stats),
          'train_step_seconds': step_seconds, 'train_step_seconds_all': step_times,
          'train_tokens_per_sec': batch_size * target_length / step_seconds,
          'compile_seconds': {'train_step': compile_seconds}, 'train_step_temp_mb': temp_mb,
          'train_step_flops': flops_lib.train_step_flops(model.config, batch_size, source_length,
                                                         target_length),
          'final_loss': float(metrics['train_loss'])}


def benchmark_decoding(model, variables, batch_size: int, source_length: int, target_length: int,
                       vocab_size: int, beam_size: int, repeats: int) -> dict:
  source = jnp.asarray(synthetic_batch(batch_size, source_length, 2, vocab_size, seed=1)
                       ['encoder_input_tokens'])
  results = {}
  for name, beam in (('greedy', 1), (f'beam{beam_size}', beam_size)):
    search = functools.partial(translate_lib.translate, model, beam_size=beam,
                               max_length_a=target_length, max_length_b=0.0)
    start = time.perf_counter()
    jax.block_until_ready(search(variables, source))  # compiles
    compile_seconds = time.perf_counter() - start
    seconds = median_seconds(lambda: search(variables, source), repeats)
    results[name] = {'sentences_per_sec': batch_size / seconds, 'seconds_per_batch': seconds,
                     'compile_and_first_call_seconds': compile_seconds}
  return results


def measure(config, *, vocab_size: int, batch_size: int, source_length: int, target_length: int,
            steps: int, warmup: int, decode_batch_size: int, decode_repeats: int, beam_size: int,
            peak_tflops: float | None = None, profile_dir: str | None = None) -> dict:
  """Every figure of the report as a JSON-ready dict."""
  device = jax.devices()[0]
  train = benchmark_training(config, vocab_size, batch_size, source_length, target_length,
                             steps, warmup, profile_dir)
  # Decoding compiles two more programs: a run stopped during them still reports training.
  print(f"train measured: {train['train_tokens_per_sec']:,.0f} target tokens/s, "
        f"{train['train_step_seconds'] * 1e3:.2f} ms/step, {train['train_step_flops'] / 1e9:,.1f} "
        f"GFLOP/step, compile {train['compile_seconds']['train_step']:.1f} s; decoding next", flush=True)
  decode = benchmark_decoding(train['model'], train['variables'], decode_batch_size, source_length,
                              target_length, vocab_size, beam_size, decode_repeats)
  achieved_tflops = train['train_step_flops'] / train['train_step_seconds'] / 1e12
  report = {
      'device': f'{device.platform}: {device.device_kind} x{jax.device_count()}',
      'jax_version': jax.__version__,
      'dtype': config.model.dtype,
      'shape': {'batch_size': batch_size, 'source_length': source_length,
                'target_length': target_length, 'vocab_size': vocab_size},
      'train_tokens_per_sec': train['train_tokens_per_sec'],
      'train_step_seconds': train['train_step_seconds'],
      'train_step_seconds_all': train['train_step_seconds_all'],
      'compile_seconds': train['compile_seconds']['train_step'],
      'train_step_temp_mb': train['train_step_temp_mb'],
      'loss_chunk_tokens': config.train.loss_chunk_tokens,
      'train_step_flops': train['train_step_flops'],
      'achieved_tflops': achieved_tflops,
      'decode_sentences_per_sec': {name: r['sentences_per_sec'] for name, r in decode.items()},
      'decode': decode,
      'peak_rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      'final_train_loss': train['final_loss'],
      'profile_top': train['profile_top'],
  }
  if device.platform == 'cpu':
    report['cpu_matmul_peak_gflops'] = cpu_matmul_gflops()
    report['fraction_of_matmul_peak'] = achieved_tflops * 1e3 / report['cpu_matmul_peak_gflops']
  else:
    stats = device.memory_stats() or {}
    report['device_peak_memory_mb'] = stats.get('peak_bytes_in_use', 0) / 2**20
    peak = peak_tflops or next((tflops for (kind, dtype), tflops in PEAK_TFLOPS_TABLE.items()
                                if device.device_kind.startswith(kind) and dtype == config.model.dtype),
                               None)
    report['peak_tflops'] = peak
    report['mfu'] = achieved_tflops / peak if peak else None
  return report


def summary(report: dict) -> str:
  lines = [
      f"device {report['device']}, jax {report['jax_version']}, {report['dtype']}, "
      f"batch {report['shape']}",
      f"train   {report['train_tokens_per_sec']:,.0f} target tokens/s, "
      f"{report['train_step_seconds'] * 1e3:,.1f} ms/step (median), "
      f"compile {report['compile_seconds']:.1f} s; XLA's scratch memory "
      f"{report['train_step_temp_mb'] or 0:,.0f} MB (loss chunks {report['loss_chunk_tokens'] or 'off'})",
      f"flops   {report['train_step_flops'] / 1e9:,.1f} GFLOP/step -> "
      f"{report['achieved_tflops'] * 1e3:,.1f} GFLOP/s",
  ]
  if 'cpu_matmul_peak_gflops' in report:
    lines.append(f"        {100 * report['fraction_of_matmul_peak']:.0f}% of this CPU's "
                 f"{report['cpu_matmul_peak_gflops']:.0f} GFLOP/s float32 matmul")
  else:
    mfu = f"{100 * report['mfu']:.1f}%" if report['mfu'] else 'unknown peak (--peak_tflops)'
    lines.append(f"        MFU {mfu}; device peak memory {report['device_peak_memory_mb']:,.0f} MB")
  for name, r in report['decode'].items():
    lines.append(f"decode  {name}: {r['sentences_per_sec']:,.1f} sentences/s "
                 f"(compile+first call {r['compile_and_first_call_seconds']:.1f} s)")
  lines.append(f"memory  peak RSS {report['peak_rss_mb']:,.0f} MB")
  if report['profile_top']:
    lines.append('profile, top operations of 5 traced steps:')
    lines.append(profile_summary.format_table([(row['operation'], row['seconds'], row['share'])
                                               for row in report['profile_top']]))
  return '\n'.join(lines)


def main(argv):
  del argv
  # What the script prints is its output; library INFO records go only where --verbosity asks.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  config = command_line.config_from_flags()
  report = measure(
      config, vocab_size=VOCAB_SIZE.value or config.data.vocab_size, batch_size=BATCH_SIZE.value,
      source_length=SOURCE_LENGTH.value, target_length=TARGET_LENGTH.value, steps=STEPS.value,
      warmup=WARMUP.value, decode_batch_size=DECODE_BATCH_SIZE.value,
      decode_repeats=DECODE_REPEATS.value, beam_size=BEAM_SIZE.value, peak_tflops=PEAK_TFLOPS.value,
      profile_dir=PROFILE_DIR.value)
  if OUT.value:  # written before the summary, so that a long measurement is never lost to it
    Path(OUT.value).parent.mkdir(parents=True, exist_ok=True)
    Path(OUT.value).write_text(json.dumps(report, indent=2))
  print(summary(report))


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  app.run(main, flags_parser=command_line.parse_flags)
