"""Gradient norms per layer of trained runs, and how far each layer moved from its initialisation.

  python -m scripts.trained_gradients --run=runs/no_residual_s0 --run=runs/no_residual_s1 \
      --checkpoint=400 --checkpoint=1600 --out=runs/analyses/trained_gradients.json

scripts/grad_norms.py measures the gradient per layer at initialisation; this script measures it
where training has taken a run, at one checkpoint or several along the way. For each run folder
and each --checkpoint (as eval.py reads it: a saved step, 'last' or 'best'): its variables, the
initialisation train.py started it from (its config's
seed), and the gradient of the training loss without dropout on the first --num_pairs pairs of
--split, as grad_norms.py takes it. Per layer of each stack:
  grad_<stack>_ffn_w2   the FFN W2 kernel's gradient norm at the checkpoint;
  moved_<stack>         ||theta_t - theta_0|| / ||theta_0|| over all of the layer's parameters;
  unchanged_<stack>     whether the layer's parameters are still bitwise their initial values:
                        Adam moves a parameter whose every gradient was exactly 0 by exactly 0.
The JSON holds `settings` and, per run folder, one entry per checkpoint with its `step`, `seed`
and those lists; the PNG plots the first two per stack against the layer, a line per checkpoint:
the runs' mean with their range shaded.
"""

from pathlib import Path

from absl import app, flags
import jax
import jax.numpy as jnp
import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
import numpy as np

from analysis import experiment
from evaluation import trained_model
from scripts.grad_norms import kernel_gradient_norms
from training import command_line, partitioning, run_log

RUNS = flags.DEFINE_multi_string('run', None, 'A run folder of train.py (repeat the flag; one model '
                                  'shape for all).', required=True)
CHECKPOINTS = flags.DEFINE_multi_string('checkpoint', ['last'], "'last', 'best' or a saved step "
                                        '(repeat the flag for several, in training order).')
NUM_PAIRS = flags.DEFINE_integer('num_pairs', 64, 'Sentence pairs the gradient is taken on.',
                                 lower_bound=1)
SPLIT = flags.DEFINE_string('split', 'train', 'Split the pairs come from (its first num_pairs).')
OUT = flags.DEFINE_string('out', None, 'The JSON written (its PNG beside it).', required=True)

STACKS = ('encoder', 'decoder')


def layer_changes(params: dict, initial: dict, layers: int, stack: str) -> tuple[list, list]:
  """Per layer: ||theta_t - theta_0|| / ||theta_0|| over its parameters, and whether all are
  bitwise unchanged."""
  moved, unchanged = [], []
  for index in range(layers):
    now = jax.tree.leaves(params[f'{stack}_layer_{index}'])
    then = jax.tree.leaves(initial[f'{stack}_layer_{index}'])
    difference = np.sqrt(sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(now, then)))
    size = np.sqrt(sum(float(jnp.sum(b ** 2)) for b in then))
    moved.append(difference / size)
    unchanged.append(all(bool(jnp.array_equal(a, b)) for a, b in zip(now, then)))
  return moved, unchanged


def measure_run(workdir: str, checkpoint: str, num_pairs: int, split: str, mesh) -> dict:
  restored = trained_model.restore(workdir, None, checkpoint, mesh)
  config, model = restored.config, restored.model
  _, (batch,) = experiment.load_batches_or_exit(config.data, split, num_pairs, batch_size=num_pairs)
  norms = jax.device_get(kernel_gradient_norms(model, restored.variables, batch,
                                               config.train.label_smoothing))
  initial = experiment.init_variables(model, config.train.seed)['params']
  result = {'step': restored.steps[-1], 'seed': config.train.seed}
  layers = {'encoder': model.config.num_encoder_layers, 'decoder': model.config.num_decoder_layers}
  for stack in STACKS:
    result[f'grad_{stack}_ffn_w2'] = [float(norm) for norm in norms[f'{stack}_ffn_w2']]
    moved, unchanged = layer_changes(restored.variables['params'], initial, layers[stack], stack)
    result[f'moved_{stack}'], result[f'unchanged_{stack}'] = moved, unchanged
  return result


def plot(runs: dict) -> Figure:
  """Rows: the W2 gradient and the distance moved; columns: encoder, decoder; a line per
  checkpoint, the runs' mean with their range shaded."""
  figure = Figure(figsize=(10, 7), layout='constrained')
  axes_grid = figure.subplots(2, 2)
  checkpoints = len(next(iter(runs.values())))
  colours = [matplotlib.colormaps['viridis'](i / max(checkpoints - 1, 1)) for i in range(checkpoints)]
  for row, (name, title) in enumerate((('grad_{}_ffn_w2', 'FFN W2 gradient norm'),
                                       ('moved_{}', '||theta_t - theta_0|| / ||theta_0||'))):
    for column, stack in enumerate(STACKS):
      axes = axes_grid[row, column]
      for index, colour in enumerate(colours):
        values = np.array([run[index][name.format(stack)] for run in runs.values()])  # [runs, L]
        steps = sorted({run[index]['step'] for run in runs.values()})
        label = f'step {steps[0]}' if len(steps) == 1 else f'steps {steps[0]}-{steps[-1]}'
        layers = range(1, values.shape[1] + 1)
        axes.plot(layers, values.mean(0), marker='o', color=colour, label=label)
        axes.fill_between(layers, values.min(0), values.max(0), color=colour, alpha=0.2)
      axes.set(title=f'{stack}: {title} ({len(runs)} runs)', xlabel='layer')
      axes.set_yscale('symlog', linthresh=1e-8)  # exact zeros stay on the plot
      axes.xaxis.set_major_locator(MaxNLocator(integer=True))
      axes.legend(fontsize='small')
  return figure


def main(argv) -> None:
  del argv
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  mesh = partitioning.make_mesh()
  try:
    runs = {workdir: [measure_run(workdir, checkpoint, NUM_PAIRS.value, SPLIT.value, mesh)
                      for checkpoint in CHECKPOINTS.value] for workdir in RUNS.value}
  except ValueError as error:
    raise SystemExit(f'invalid command line: {command_line.one_line_error(error)}') from None
  results = {'settings': {'checkpoints': CHECKPOINTS.value, 'num_pairs': NUM_PAIRS.value,
                          'split': SPLIT.value, 'dropout': 'off (train=False)'}, 'runs': runs}
  out = Path(OUT.value)
  experiment.write(out, results, plot(runs))
  for workdir, checkpoints in runs.items():
    for run in checkpoints:
      print(f"{workdir} (step {run['step']}, seed {run['seed']}):")
      for stack in STACKS:
        print(f'  {stack} W2 gradient: ' + ' '.join(f'{v:.2g}' for v in run[f'grad_{stack}_ffn_w2'])
              + '; moved: ' + ' '.join(f'{v:.2g}' for v in run[f'moved_{stack}'])
              + '; unchanged: ' + ' '.join('yes' if v else 'no' for v in run[f'unchanged_{stack}']))
  print(f'wrote {out} and {out.with_suffix(".png")}')


if __name__ == '__main__':
  app.run(main, flags_parser=command_line.parse_flags)
