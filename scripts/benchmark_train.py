"""Training throughput of train.py itself on real Multi30k batches: our side of the fairseq table.

  SEQ2SEQ_DATA_DIR=../shared/data python -m scripts.benchmark_train --recipe=tiny
  SEQ2SEQ_DATA_DIR=../shared/data python -m scripts.benchmark_train --recipe=small --steps=120

Runs `training.trainer.train_and_evaluate` (the loop users run: the grain pipeline, bucketed batches with
their real padding, the per-step host work) for `--steps` steps of a recipe matching
`../shared/peers/fairseq/bench.sh`: Multi30k De->En, max_tokens 4096, Adam (0.9, 0.98),
inverse-sqrt warmup, label smoothing 0.1, no validation and no checkpoints inside the timed
steps. Reports the median over log windows (after the first) of real target tokens per second,
EOS included and padding excluded, which is what fairseq's `wps` counts; compilation is timed
apart, as train.py does. A benchmark, not a test: nothing here asserts a speed.
"""

import json
from pathlib import Path
import statistics
import tempfile

from absl import app, flags
import jax

from configs import multi30k
from training import command_line, trainer
from training.run_dir import METRICS_FILE

# The two shapes of ../shared/peers/fairseq/bench.sh, with its learning rates and warmups.
RECIPES = {
    # Wu et al.'s Transformer-tiny, the `:en_de` model.
    'tiny': dict(model=dict(d_model=128, num_heads=4, d_ff=256, num_encoder_layers=4,
                            num_decoder_layers=4, dropout_rate=0.3),
                 optim=dict(learning_rate=5e-3, warmup_steps=2000)),
    # The default De->En recipe's depth and width, with fairseq's FFN 512 and 8 heads.
    'small': dict(model=dict(d_model=256, num_heads=8, d_ff=512, num_encoder_layers=3,
                             num_decoder_layers=3, dropout_rate=0.1),
                  optim=dict(learning_rate=5e-4, warmup_steps=4000)),
}

RECIPE = flags.DEFINE_enum('recipe', 'tiny', list(RECIPES), 'Model shape and optimizer of the run.')
STEPS = flags.DEFINE_integer('steps', 120, 'Training steps (fairseq bench.sh: 120 updates).')
LOG_EVERY = flags.DEFINE_integer('log_every', 20, 'Steps per throughput window (fairseq: 20).')
OUT = flags.DEFINE_string('out', None, 'Write the measurements here as JSON.')
WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory (default: a fresh temporary one).')


def recipe_config(recipe: str, steps: int, log_every: int):
  config = multi30k.get_config('de_en')
  for section, fields in RECIPES[recipe].items():
    config[section].update(fields)
  config.optim.schedule = 'inverse_sqrt'
  # Evaluation and checkpoints only after the last step, outside the timed windows.
  config.train.update(num_steps=steps, log_every=log_every, eval_every=10**9,
                      checkpoint_every=10**9, num_epochs=0)
  config.data.eval_examples = 8
  return config


def measure(config, workdir: str) -> dict:
  trainer.train_and_evaluate(config, workdir)
  records = [json.loads(line) for line in Path(workdir, METRICS_FILE).read_text().splitlines()]
  windows = [r['tokens_per_sec'] for r in records if 'tokens_per_sec' in r]
  last = [r for r in records if 'compiled_shapes' in r][-1]
  return {
      'device': f'{jax.devices()[0].platform}: {jax.devices()[0].device_kind} x{jax.device_count()}',
      'jax_version': jax.__version__,
      'steps': config.train.num_steps,
      'tokens_per_sec': statistics.median(windows[1:] or windows),
      'tokens_per_sec_windows': windows,
      'compiled_shapes': last['compiled_shapes'],
      'compile_seconds': last['compile_seconds'],
  }


def main(argv):
  del argv
  config = recipe_config(RECIPE.value, STEPS.value, LOG_EVERY.value)
  with tempfile.TemporaryDirectory() as scratch:
    report = measure(config, WORKDIR.value or scratch)
  report['recipe'] = RECIPE.value
  print(f"train.py {RECIPE.value}: median {report['tokens_per_sec']:,.0f} real target tokens/s "
        f"over {report['steps']} steps; {report['compiled_shapes']} shapes compiled in "
        f"{report['compile_seconds']:.0f} s ({report['device']})")
  if OUT.value:
    Path(OUT.value).parent.mkdir(parents=True, exist_ok=True)
    Path(OUT.value).write_text(json.dumps(report, indent=2))


if __name__ == '__main__':
  app.run(main, flags_parser=command_line.parse_flags)
