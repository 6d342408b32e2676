"""Training throughput of train.py itself on real Multi30k batches: our side of the fairseq table.

  SEQ2SEQ_DATA_DIR=../shared/data python -m scripts.benchmark_train --recipe=tiny
  SEQ2SEQ_DATA_DIR=../shared/data python -m scripts.benchmark_train --recipe=small --steps=120
  SEQ2SEQ_DATA_DIR=../shared/data python -m scripts.benchmark_train --recipe=small --pack_length=0 --max_tokens=4096
  SEQ2SEQ_DATA_DIR=../shared/data python -m scripts.benchmark_train --vocabulary=separate
  SEQ2SEQ_DATA_DIR=../shared/data python -m scripts.benchmark_train --seeds=4   # 4 seeds together
  SEQ2SEQ_DATA_DIR=../shared/data python -m scripts.benchmark_train --profile_steps=16   # traced

Runs `training.trainer.train_and_evaluate` (the loop users run: the grain pipeline, batches with
their real padding, the per-step host work) for `--steps` steps of a recipe matching
`../shared/peers/fairseq/bench.sh`: Multi30k De->En, Adam (0.9, 0.98),
inverse-sqrt warmup, label smoothing 0.1, no validation and no checkpoints inside the timed
steps (with --seeds N, N seeds trained together by training/members.py). Reports the median over log windows (after the first) of real target tokens per second,
EOS included and padding excluded, which is what fairseq's `wps` counts; compilation is timed
apart, as train.py does. By default the batches are those of the `:de_en` and `:en_de` presets:
several pairs per row of 32 tokens, 3520 padded tokens per batch, which hold as many real target
tokens as one pair per row at 4096 (--pack_length=0 --max_tokens=4096): 149 against 150 steps
per Multi30k epoch; fairseq's length-sorted --max-tokens 4096 batches hold ~15% more (129
updates per epoch). A benchmark, not a test: nothing here asserts a speed.

It also counts the matrix-product FLOPs (`model/flops.py`) of the very batches the run trained on,
per real target token, which is what padding costs, and with the token rate the FLOP rate the loop
reached, beside the float32 matmul rate this CPU reaches in the same process
(docs/performance.md, "Training against fairseq: where the step stands").
"""

import json
from pathlib import Path
import statistics
import tempfile

from absl import app, flags
import jax

from configs import multi30k
from data import datasets, pipeline, vocabularies as vocabularies_lib
from model import flops
from model.config import DTYPES
from model.transformer import Transformer
from scripts import profile_summary
from scripts.timing import cpu_matmul_gflops
from training import command_line, members, run_dir, run_log, train_state, trainer
from training.run_dir import METRICS_FILE

def _recipe(layers: int, d_model: int, d_ff: int, heads: int, dropout: float, learning_rate: float,
            warmup_steps: int) -> dict:
  """Config fields of a recipe: layers per side, width, FFN, heads, dropout, peak rate, warmup."""
  return dict(model=dict(d_model=d_model, num_heads=heads, d_ff=d_ff, num_encoder_layers=layers,
                         num_decoder_layers=layers, dropout_rate=dropout),
              optim=dict(learning_rate=learning_rate, warmup_steps=warmup_steps))


# The two shapes of ../shared/peers/fairseq/bench.sh, with its learning rates and warmups, and two
# wider ones as fairseq's presets of those widths (scripts/benchmark_widths.sh times fairseq on them).
RECIPES = {
    'tiny': _recipe(4, 128, 256, 4, 0.3, 5e-3, 2000),  # Wu et al.'s Transformer-tiny, the `:en_de` model
    # The `:de_en_small` recipe's depth and width, with fairseq's FFN 512 and 8 heads.
    'small': _recipe(3, 256, 512, 8, 0.1, 5e-4, 4000),
    'iwslt': _recipe(6, 512, 1024, 4, 0.3, 5e-4, 4000),  # fairseq's transformer_iwslt_de_en
    'big': _recipe(6, 1024, 4096, 16, 0.3, 5e-4, 4000),  # fairseq's transformer_vaswani_wmt_en_de_big
}

RECIPE = flags.DEFINE_enum('recipe', 'tiny', list(RECIPES), 'Model shape and optimizer of the run.')
STEPS = flags.DEFINE_integer('steps', 120, 'Training steps (fairseq bench.sh: 120 updates).')
LOG_EVERY = flags.DEFINE_integer('log_every', 20, 'Steps per throughput window (fairseq: 20).')
OUT = flags.DEFINE_string('out', None, 'Write the measurements here as JSON.')
WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory (default: a fresh temporary one).')
PACK_LENGTH = flags.DEFINE_integer('pack_length', None, 'config.data.pack_length: pack pairs into '
                                   'rows of this many tokens (0: one pair per row; default: the '
                                   ':de_en preset\'s).')
MAX_TOKENS = flags.DEFINE_integer('max_tokens', None, 'config.data.max_tokens: padded tokens per '
                                  'batch and side (default: the :de_en preset\'s).', lower_bound=1)
STEPS_PER_CALL = flags.DEFINE_integer('steps_per_call', 1, 'config.train.steps_per_call: optimizer '
                                      'steps per dispatch.', lower_bound=1)
MICROBATCH_TOKENS = flags.DEFINE_integer('microbatch_tokens', None, 'config.train.microbatch_tokens: '
                                         'compute each step in slices of this many tokens (0: the '
                                         'whole batch; default: by platform, 512 on a CPU).')
DTYPE = flags.DEFINE_enum('dtype', 'float32', list(DTYPES), 'config.model.dtype: the compute dtype '
                          '(params, logits, softmax, norm statistics and the loss stay float32).')
SEEDS = flags.DEFINE_integer('seeds', 1, 'Seeds trained together as one program (training/members.py); '
                             'the throughput is their sum.', lower_bound=1)
PROFILE_STEPS = flags.DEFINE_integer('profile_steps', 0, 'config.train.profile_steps: trace this many '
                                     'steps after the first log window with jax.profiler and report '
                                     'their top operations and, on an accelerator, the share of the '
                                     'traced time the device was busy (one window runs traced: the '
                                     'median leaves it out).', lower_bound=0)
VOCABULARY = flags.DEFINE_enum('vocabulary', 'joint', list(vocabularies_lib.VOCABULARIES), 'config.data.vocabulary; '
                               "'separate' also sets config.model.share_embeddings=False.")


def recipe_config(recipe: str, steps: int, log_every: int, pack_length: int | None = None,
                  microbatch_tokens: int | None = None, dtype: str = 'float32',
                  max_tokens: int | None = None, vocabulary: str = 'joint', steps_per_call: int = 1,
                  profile_steps: int = 0):
  """The :de_en preset (its data and batching) with the recipe's model and optimizer; None keeps
  the preset's pack_length and max_tokens."""
  config = multi30k.get_config('de_en')
  config.model.dtype = dtype
  config.data.vocabulary = vocabulary
  config.model.share_embeddings = vocabulary == 'joint'
  if pack_length is not None:
    config.data.pack_length = pack_length
  if max_tokens is not None:
    config.data.max_tokens = max_tokens
  config.train.microbatch_tokens = microbatch_tokens
  config.train.steps_per_call = steps_per_call
  config.train.profile_steps = profile_steps
  for section, fields in RECIPES[recipe].items():
    config[section].update(fields)
  config.optim.schedule = 'inverse_sqrt'
  # Evaluation and checkpoints only after the last step, outside the timed windows.
  # Exactly `steps`, whatever the preset's time budget would plan.
  config.train.update(num_steps=steps, log_every=log_every, eval_every=10**9,
                      checkpoint_every=10**9, num_epochs=0, time_budget_minutes=0.0)
  config.data.eval_examples = 8
  return config


def measure(config, workdir: str, seeds: int = 1) -> dict:
  """The run's median tokens/s over its log windows after the first; with `seeds` > 1 those seeds
  trained together, each window's tokens/s summed over them (each member counts its own tokens
  over the group's wall time)."""
  if seeds == 1:
    workdirs = [workdir]
    trainer.train_and_evaluate(config, workdir)
  else:
    group = members.parse_members([str(seed) for seed in range(seeds)], [])
    workdirs = members.member_workdirs(workdir, group)
    members.train_members(config, workdirs, group)
  member_windows = []
  for run in workdirs:
    records = [json.loads(line) for line in Path(run, METRICS_FILE).read_text().splitlines()]
    member_windows.append([r['tokens_per_sec'] for r in records if 'tokens_per_sec' in r])
  windows = [sum(window) for window in zip(*member_windows)]
  last = [r for r in records if 'compiled_shapes' in r][-1]
  profile = {}
  if config.train.profile_steps:
    events = profile_summary.read_events(str(Path(workdirs[0], run_dir.PROFILE_DIR)))
    profile = {'profile_steps': config.train.profile_steps,
               'profile_device_busy': profile_summary.device_busy(events),
               'profile_top': [{'operation': name, 'seconds': seconds, 'share': share}
                               for name, seconds, share
                               in profile_summary.top_operations(events, 15)]}
  return {
      'seeds': seeds,
      'device': f'{jax.devices()[0].platform}: {jax.devices()[0].device_kind} x{jax.device_count()}',
      'jax_version': jax.__version__,
      'steps': config.train.num_steps,
      'tokens_per_sec': statistics.median(windows[1:] or windows),
      'tokens_per_sec_windows': windows,
      'compiled_shapes': last['compiled_shapes'],
      'compile_seconds': last['compile_seconds'],
      **profile,
  }


def flops_per_target_token(config) -> float:
  """Matmul FLOPs of the run's training steps per real target token, over the same batches.

  The batch order depends only on the seed, so a fresh iterator yields the batches the run took.
  """
  data = datasets.resolve(config.data)
  vocabularies = vocabularies_lib.get_vocabularies(data)
  model_config = Transformer.of(config.model, vocabularies.source.vocab_size,
                                vocabularies.target.vocab_size).config
  batches = pipeline.make_train_iterator(data, vocabularies, seed=config.train.seed,
                                         batch_multiple=jax.local_device_count())
  total_flops = target_tokens = 0
  for _ in range(config.train.num_steps):
    batch = next(batches)
    rows, source_length = batch['encoder_input_tokens'].shape
    total_flops += flops.train_step_flops(model_config, rows, source_length,
                                          batch['decoder_input_tokens'].shape[1])
    target_tokens += float(batch['decoder_target_weights'].sum())
  return total_flops / target_tokens


def main(argv):
  del argv
  # What the script prints is its output; library INFO records go only where --verbosity asks.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  config = recipe_config(RECIPE.value, STEPS.value, LOG_EVERY.value, PACK_LENGTH.value,
                         MICROBATCH_TOKENS.value, DTYPE.value, MAX_TOKENS.value, VOCABULARY.value,
                         STEPS_PER_CALL.value, PROFILE_STEPS.value)
  with tempfile.TemporaryDirectory() as scratch:
    report = measure(config, WORKDIR.value or scratch, SEEDS.value)
  report['recipe'] = RECIPE.value
  report['pack_length'] = config.data.pack_length
  report['max_tokens'] = config.data.max_tokens
  report['microbatch_tokens'] = train_state.microbatch_tokens(config)
  report['dtype'] = DTYPE.value
  report['vocabulary'] = VOCABULARY.value
  report['matmul_flops_per_target_token'] = flops_per_target_token(config)
  report['model_gflops_per_sec'] = report['tokens_per_sec'] * report['matmul_flops_per_target_token'] / 1e9
  if jax.devices()[0].platform == 'cpu':
    report['cpu_matmul_peak_gflops'] = cpu_matmul_gflops()
  together = f' ({SEEDS.value} seeds together)' if SEEDS.value > 1 else ''
  print(f"train.py {RECIPE.value}{together}: median {report['tokens_per_sec']:,.0f} real target tokens/s "
        f"over {report['steps']} steps; {report['compiled_shapes']} shapes compiled in "
        f"{report['compile_seconds']:.0f} s ({report['device']})")
  peak = (f"; this CPU's float32 matmul: {report['cpu_matmul_peak_gflops']:.0f} GFLOP/s"
          if 'cpu_matmul_peak_gflops' in report else '')
  print(f"  {report['matmul_flops_per_target_token'] / 1e6:.2f} matmul MFLOP per real target token, "
        f"{report['model_gflops_per_sec']:.1f} GFLOP/s{peak}")
  if report.get('profile_top'):
    busy = report['profile_device_busy']
    print(f"  {report['profile_steps']} traced steps' top operations"
          + (f', device busy {busy:.1%} of the traced time:' if busy is not None else ':'))
    print(profile_summary.format_table([(row['operation'], row['seconds'], row['share'])
                                        for row in report['profile_top']]))
  if OUT.value:
    Path(OUT.value).parent.mkdir(parents=True, exist_ok=True)
    Path(OUT.value).write_text(json.dumps(report, indent=2))


if __name__ == '__main__':
  app.run(main, flags_parser=command_line.parse_flags)
