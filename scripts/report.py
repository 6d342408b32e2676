"""Compares the runs of a sweep: a Markdown table, a CSV and learning-curve plots.

  python -m scripts.report runs/xiong_warmup
  python -m scripts.report runs/xiong_warmup --out_dir=reports/warmup --colour_by=optimizer --panel_by=lr
  python -m scripts.report results/convergence --fields=norm_position,lr,warmup --up_to_step=1600

Reads every run's status.json, metrics.jsonl, config.json and eval/<split>.json (from eval.py) in
the sweep folder and writes report.md, report.csv, train_loss.png, val_loss.png and val_bleu.png.
A row per run: its swept fields, its state (finished, diverged@STEP, failed@STEP, running@STEP,
not started), final and best validation loss (with the step), final and best greedy BLEU, final
training loss, the validation loss's change over the last fifth of the run (converged below 1%),
loss spikes (logged windows above 1.5x the one before), median tokens/s and the BLEU of every
eval.py split. The runs and swept fields
come from the folder's sweep.json; without one (runs launched from --dry_run commands), from the
config.json fields that differ between the subfolders. Works on a sweep still running.
"""


from absl import app, flags
from etils import epath


from experiments import report

OUT_DIR = flags.DEFINE_string('out_dir', None, 'Where the report goes (default: the sweep folder).')
COLOUR_BY = flags.DEFINE_string('colour_by', None, 'Swept field that colours the curves (default: the first).')
PANEL_BY = flags.DEFINE_string('panel_by', None, 'Swept field with a panel per value (default: the second).')
FIELDS = flags.DEFINE_list('fields', None, 'The fields the runs are compared by (default: those that '
                           'differ between the runs, or sweep.json\'s), and the seed where runs have one.')
UP_TO_STEP = flags.DEFINE_integer('up_to_step', None, 'Read each run\'s records to this step only, to '
                                  'compare runs of different lengths at one step.', lower_bound=1)


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    raise SystemExit('usage: report.py SWEEP_DIR [--out_dir=DIR] [--colour_by=FIELD] [--panel_by=FIELD] '
                     '[--fields=FIELD,...] [--up_to_step=N]')
  sweep_dir = argv[1]
  try:
    paths = report.write_report(sweep_dir, OUT_DIR.value or sweep_dir, COLOUR_BY.value, PANEL_BY.value,
                                FIELDS.value, UP_TO_STEP.value)
  except ValueError as error:
    raise SystemExit(f'report.py: {error}') from None
  print(epath.Path(paths[0]).read_text())
  print('wrote ' + ', '.join(paths))


if __name__ == '__main__':
  app.run(main)
