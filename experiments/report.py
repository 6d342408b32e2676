"""Writes a sweep's report: report.md (a Markdown table and the plots), report.csv and the PNG plots;
for a sweep over seeds also the table over seeds (report_seeds.csv).

scripts/report.py is its command line; the rows come from experiments/results.py, the plots from
experiments/plots.py.
"""

import collections
import os

from etils import epath

from experiments import plots, results, sweeps


def write_report(sweep_dir: str, out_dir: str, colour_by: str | None = None,
                 panel_by: str | None = None, compare: list[str] | None = None,
                 up_to_step: int | None = None) -> list[str]:
  """Writes report.md, report.csv and the plots into `out_dir`; returns the paths written.

  Raises:
    ValueError: for a folder without runs or an unknown --colour_by/--panel_by/--fields field.
  """
  runs, fields = results.load_runs(sweep_dir, compare, up_to_step)
  header, text_rows, csv_rows = results.table(runs, fields)
  epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
  images = plots.plot_curves(runs, fields, out_dir, colour_by=colour_by, panel_by=panel_by)
  states = collections.Counter(results.state_text(run.status).split('@')[0] for run in runs)
  sweep = sweeps.read_sweep_json(sweep_dir)
  source = f'the sweep of `{sweep["config"]}`' if sweep else 'runs compared by their config.json'
  counts = ', '.join(f'{count} {state}' for state, count in states.items())
  lines = [f'# {sweep_dir}', '', f'{len(runs)} runs, {source}: {counts}.', '']
  written = []
  if sweeps.SEED_FIELD in fields:
    seed_header, seed_rows, seed_csv_rows = results.seed_table(runs, fields)
    lines += ['## Over seeds: mean ± sample standard deviation', '',
              'A value over fewer seeds than the group has (a seed diverged or has not got there) '
              'says over how many. Plots: mean curves, shaded ± one standard deviation.', '',
              results.markdown(seed_header, seed_rows), '## Every run', '']
    seeds_csv_path = epath.Path(out_dir) / 'report_seeds.csv'
    results.write_csv(seeds_csv_path, seed_csv_rows)
    written.append(os.fspath(seeds_csv_path))
  lines.append(results.markdown(header, text_rows))
  for path in images:
    file_name = os.path.basename(path)
    lines.append(f'![{os.path.splitext(file_name)[0]}]({file_name})\n')
  markdown_path = epath.Path(out_dir) / 'report.md'
  markdown_path.write_text('\n'.join(lines))
  csv_path = epath.Path(out_dir) / 'report.csv'
  results.write_csv(csv_path, csv_rows)
  return [os.fspath(markdown_path), os.fspath(csv_path), *written, *images]
