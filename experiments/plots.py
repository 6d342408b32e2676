"""Learning curves of a sweep's runs as PNGs, grouped by the swept fields.

By default the first swept field picks a line's colour (norm_position: Post-LN vs Pre-LN), the
second its panel (one panel per warmup) and any others its line style (peak rate, optimizer), so
every run is one line and runs that differ in the first field sit side by side. A diverged run's
line ends in a cross. Runs that differ only in seed are one line, their mean, in a band of ± one
standard deviation. Figures use matplotlib's object API (Figure, rendered by Agg), not pyplot's
global state, so no display is needed.
"""

import io
import math
import os

from etils import epath
from matplotlib import colormaps
from matplotlib.figure import Figure

from experiments import sweeps
from experiments.results import RunRecords, mean_and_std, seed_groups, state_text

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
  def resolve(name, flag):
    if name is None:
      return None
    field = sweeps.field_named(name, fields)
    if field is None:
      labels = sweeps.field_labels(fields).values()
      raise ValueError(f'{flag}={name} is not a swept field; they are: {", ".join(labels) or "none"}')
    return field

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


def _mean_curve(records_per_seed: list[list[dict]], metric: str):
  """Steps, mean and sample standard deviation (None for a single seed) over the seeds that have a
  record at each step."""
  by_step: dict[int, list[float]] = {}
  for records in records_per_seed:
    for record in records:
      by_step.setdefault(record['step'], []).append(record[metric])
  steps = sorted(by_step)
  stats = [mean_and_std(by_step[step]) for step in steps]
  return steps, [mean for mean, _ in stats], [std for _, std in stats]


def plot_curves(runs: list[RunRecords], fields: list[str], out_dir: str, *,
                colour_by: str | None = None, panel_by: str | None = None) -> list[str]:
  """Writes train_loss.png, val_loss.png and val_bleu.png (those with records) and returns their paths.

  Runs that differ only in seed are one line: the mean over the seeds with a record at each step,
  shaded ± one sample standard deviation. Loss axes stop a little above ln(vocabulary size), so
  one exploding run does not flatten the others.
  """
  grouped = [field for field in fields if field != sweeps.SEED_FIELD]
  colour, panel, rest = grouping(grouped, colour_by, panel_by)
  labels = sweeps.field_labels(grouped)
  value = lambda run, field: str(run.values[field])
  lines = seed_groups(runs, fields)
  panels = list(dict.fromkeys(value(group[0], panel) for group in lines)) if panel else [None]
  colours = list(dict.fromkeys(value(group[0], colour) if colour else group[0].name for group in lines))
  styles = list(dict.fromkeys(tuple(value(group[0], field) for field in rest) for group in lines))
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
      for group in lines:
        first = group[0]
        if not any(curves[run.name] for run in group) or (panel and value(first, panel) != panel_value):
          continue
        with_records = [run for run in group if curves[run.name]]
        steps, ys, stds = _mean_curve([curves[run.name] for run in with_records], metric)
        label = ', '.join(f'{labels[field]}={value(first, field)}' for field in [colour, *rest] if field)
        label = label or first.name
        diverged = [run for run in group if run.status is not None and run.status['state'] == 'diverged']
        if len(group) > 1:  # the seeds this line averages
          label += f' ({len(with_records)} seeds' + (f', {len(diverged)} diverged)' if diverged else ')')
        elif diverged:
          label += f' ({state_text(first.status)})'
        color = colormaps['tab10'](colours.index(value(first, colour) if colour else first.name) % 10)
        ax.plot(steps, ys, color=color, marker='o' if kind == 'evals' else None, markersize=3,
                linestyle=_LINE_STYLES[styles.index(tuple(value(first, f) for f in rest)) % len(_LINE_STYLES)],
                label=label)
        spread = [(step, y, std) for step, y, std in zip(steps, ys, stds) if std is not None]
        if spread:
          ax.fill_between([s for s, _, _ in spread], [y - d for _, y, d in spread],
                          [y + d for _, y, d in spread], color=color, alpha=0.2, linewidth=0)
        for run in diverged:  # the cross stays in view when the line leaves it
          last = curves[run.name][-1] if curves[run.name] else None
          if last:
            ax.plot([last['step']], [last[metric] if top is None else min(last[metric], ceiling)],
                    color=color, marker='x', markersize=10, linestyle='none')
      if panel:
        ax.set_title(f'{labels[panel]}={panel_value}')
      ax.set_xlabel('step')
      ax.set_ylabel(axis_label + (' (mean ± std over seeds)' if sweeps.SEED_FIELD in fields else ''))
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
