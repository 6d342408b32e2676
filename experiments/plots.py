"""Learning curves of a sweep's runs as PNGs, grouped by the swept fields.

By default the first swept field picks a line's colour (norm_position: Post-LN vs Pre-LN), the
second its panel (one panel per warmup) and any others its line style (peak rate, optimizer), so
every run is one line and runs that differ in the first field sit side by side. A diverged run's
line ends in a cross. Figures use matplotlib's object API (Figure, rendered by Agg), not pyplot's
global state, so no display is needed.
"""

import io
import math
import os

from etils import epath
from matplotlib import colormaps
from matplotlib.figure import Figure

from experiments import sweeps
from experiments.results import RunRecords, state_text

# Metric, records it is in ('train' or 'evals'), axis label, file name.
CURVES = (
    ('train_loss', 'train', 'training loss', 'train_loss.png'),
    ('eval_loss', 'evals', 'validation loss', 'val_loss.png'),
    ('bleu', 'evals', 'validation BLEU (greedy)', 'val_bleu.png'),
)
_LINE_STYLES = ('-', '--', ':', '-.')


def grouping(fields: list[str], colour_by: str | None = None,
             panel_by: str | None = None) -> tuple[str | None, str | None, list[str]]:
  """(colour field, panel field, line-style fields) of `fields`; None where there is no field left.

  Args:
    fields: the swept fields, dotted keys.
    colour_by, panel_by: a swept field, by dotted key or by its label ('warmup'), or None for
      the default order.
  """
  labels = sweeps.field_labels(fields)

  def resolve(name, flag):
    if name is None:
      return None
    for field in fields:
      if name in (field, labels[field]):
        return field
    raise ValueError(f'{flag}={name} is not a swept field; they are: {", ".join(labels.values()) or "none"}')

  colour, panel = resolve(colour_by, '--colour_by'), resolve(panel_by, '--panel_by')
  if colour and colour == panel:
    raise ValueError(f'--colour_by and --panel_by both name {colour}')
  rest = [field for field in fields if field not in (colour, panel)]
  if colour is None and rest:
    colour = rest.pop(0)
  if panel is None and rest:
    panel = rest.pop(0)
  return colour, panel, rest


def _loss_ceiling(runs: list[RunRecords]) -> float | None:
  """ln(vocabulary size), the loss of a uniform guess: above it a curve only says 'broken'."""
  sizes = {run.config.get('data', {}).get('vocab_size') for run in runs} - {None}
  return math.log(max(sizes)) if sizes else None


def plot_curves(runs: list[RunRecords], fields: list[str], out_dir: str, *,
                colour_by: str | None = None, panel_by: str | None = None) -> list[str]:
  """Writes train_loss.png, val_loss.png and val_bleu.png (those with records) and returns their paths.

  Loss axes stop a little above ln(vocabulary size), so one exploding run does not flatten the
  others.
  """
  colour, panel, rest = grouping(fields, colour_by, panel_by)
  labels = sweeps.field_labels(fields)
  value = lambda run, field: str(run.values[field])
  panels = list(dict.fromkeys(value(run, panel) for run in runs)) if panel else [None]
  colours = list(dict.fromkeys(value(run, colour) if colour else run.name for run in runs))
  styles = list(dict.fromkeys(tuple(value(run, field) for field in rest) for run in runs))
  ceiling = _loss_ceiling(runs)
  written = []
  for metric, kind, axis_label, file_name in CURVES:
    curves = {run.name: [r for r in getattr(run, kind) if r.get(metric) is not None] for run in runs}
    if not any(curves.values()):
      continue
    highest = max(r[metric] for records in curves.values() for r in records)
    top = 1.05 * ceiling if metric.endswith('loss') and ceiling and highest > ceiling else None
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    figure = Figure(figsize=(5 * ncols, 3.6 * nrows), layout='constrained')
    axes = figure.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True).ravel()
    for ax, panel_value in zip(axes, panels):
      for run in runs:
        records = curves[run.name]
        if not records or (panel and value(run, panel) != panel_value):
          continue
        steps, ys = [r['step'] for r in records], [r[metric] for r in records]
        label = ', '.join(f'{labels[field]}={value(run, field)}' for field in [colour, *rest] if field)
        color = colormaps['tab10'](colours.index(value(run, colour) if colour else run.name) % 10)
        diverged = run.status is not None and run.status['state'] == 'diverged'
        ax.plot(steps, ys, color=color, marker='o' if kind == 'evals' else None, markersize=3,
                linestyle=_LINE_STYLES[styles.index(tuple(value(run, f) for f in rest)) % len(_LINE_STYLES)],
                label=(label or run.name) + (f' ({state_text(run.status)})' if diverged else ''))
        if diverged:  # the cross stays in view when the line leaves it
          ax.plot(steps[-1:], [ys[-1] if top is None else min(ys[-1], ceiling)], color=color,
                  marker='x', markersize=10, linestyle='none')
      if panel:
        ax.set_title(f'{labels[panel]}={panel_value}')
      ax.set_xlabel('step')
      ax.set_ylabel(axis_label)
      ax.grid(alpha=0.3)
      if ax.lines:
        ax.legend(fontsize='small')
    for ax in axes[len(panels):]:
      ax.set_visible(False)
    if top:
      axes[0].set_ylim(top=top)  # shared by every panel
    path = epath.Path(out_dir) / file_name
    image = io.BytesIO()  # written whole, so that out_dir may be on object storage
    figure.savefig(image, format='png', dpi=100)
    path.write_bytes(image.getvalue())
    written.append(os.fspath(path))
  return written
