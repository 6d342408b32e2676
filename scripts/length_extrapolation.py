"""Scores a sweep's runs by source length and summarises them: the length-extrapolation experiment.

  python -m scripts.sweep configs/sweeps/length_extrapolation.py --workdir=runs/length
  python -m scripts.length_extrapolation runs/length --splits=validation,test_2016,test_2017
  # with the same models trained on all lengths (configs/sweeps/length_extrapolation.py:cpu_all_lengths):
  python -m scripts.length_extrapolation runs/length --reference=runs/length_all

For every finished run without them yet, writes RUN/length_buckets/<split>.json: per source-length
bucket (words), the loss per target token of the reference and the greedy BLEU
(analysis/length_buckets.py). Then writes length_extrapolation.md and length_<split>.png into the
sweep folder: each position scheme's mean ± std over seeds against source length, the trained
range shaded. With --reference, its runs are scored too, and each bucket's gap to the same scheme
trained on all lengths is tabled and drawn dashed: the part of the loss that is extrapolation, not
long sentences being harder.
"""

from absl import app, flags
from etils import epath

from analysis import length_buckets
from experiments import results
from training import command_line, run_log

SPLITS = flags.DEFINE_list('splits', ['validation', 'test_2016'], 'Splits to score.')
CHECKPOINT = flags.DEFINE_string('checkpoint', 'last', "Checkpoint of each run: 'last', 'best', a step, 'avg:N'.")
RESCORE = flags.DEFINE_bool('rescore', False, 'Score runs again even where their files exist.')
REFERENCE = flags.DEFINE_string('reference', None, 'A sweep of the same models trained on all lengths: '
                                'scored as well, and each bucket reported as a gap to it.')


def score_finished_runs(sweep_dir: str) -> None:
  """Scores every finished run of the sweep that has not been scored on all of --splits."""
  runs, _ = results.load_runs(sweep_dir)
  for run in runs:
    run_dir = epath.Path(sweep_dir) / run.name
    done = all((run_dir / length_buckets.OUT_DIR / f'{split}.json').is_file() for split in SPLITS.value)
    if not run.status or run.status['state'] != 'finished' or (done and not RESCORE.value):
      continue
    print(f'{run.name}: scoring {", ".join(SPLITS.value)}', flush=True)
    length_buckets.score_run(str(run_dir), SPLITS.value, CHECKPOINT.value)


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    raise SystemExit('usage: length_extrapolation.py SWEEP_DIR [--splits=a,b] [--checkpoint=last] [--reference=DIR]')
  sweep_dir = argv[1]
  # The tables are the output; library INFO records (orbax's restores) would bury them.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  try:
    for folder in (sweep_dir, REFERENCE.value) if REFERENCE.value else (sweep_dir,):
      score_finished_runs(folder)
    paths = length_buckets.write_summary(sweep_dir, SPLITS.value, sweep_dir, REFERENCE.value)
  except ValueError as error:
    raise SystemExit(f'length_extrapolation.py: {command_line.one_line_error(error)}') from None
  print(epath.Path(paths[0]).read_text())
  print('wrote ' + ', '.join(paths))


if __name__ == '__main__':
  app.run(main, flags_parser=command_line.parse_flags)
