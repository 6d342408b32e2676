"""Length extrapolation: BLEU and per-token loss by source length, per run and over a sweep.

A run trained on short sources (config.data.train_max_source_words = k) is scored on whole
splits, bucketed by the source's word count (whitespace-separated, as the training filter counts):
  - per-token loss: teacher-forced NLL of the reference, summed over the bucket's target tokens
    (EOS included) and divided by their number, in float32 from float32 logits;
  - BLEU: detokenised corpus BLEU (sacreBLEU defaults) of the bucket's greedy hypotheses.
Each run gets RUN/length_buckets/<split>.json; `summarise` groups a sweep's runs that differ only
in seed and gives each bucket's mean and sample standard deviation, and `plot` draws them against
source length with the trained range shaded. Long sentences are harder whatever a model was trained
on, so a sweep of the same models trained on all lengths is the reference: `gaps` gives each
bucket's mean minus the reference's, the part of the loss (or BLEU) that is failure to extrapolate.

Dimensions: B sentences, S source length, T target length, V vocabulary.
"""

import io
import json
import os

from etils import epath
import jax
from matplotlib import colormaps
from matplotlib.figure import Figure
import numpy as np

from data import datasets, pipeline
from experiments import results, sweeps
from model import losses
from training import partitioning
from evaluation import trained_model, translating

# Upper ends of the source-length buckets in words; longer sources form the last bucket.
# Multi30k's validation and test_2016 have ~35 sources of more than 20 words each.
BUCKET_ENDS = (5, 10, 15, 20)
OUT_DIR = 'length_buckets'


def bucket_names() -> list[str]:
  """'1-5', '6-10', ..., '21+'."""
  return translating.bucket_names(BUCKET_ENDS)


def _sentence_nll(model):
  @jax.jit
  def nll(variables, batch):
    logits = model.apply(variables, batch['encoder_input_tokens'], batch['decoder_input_tokens'])  # [B, T, V]
    _, token_nll = losses.token_losses(logits, batch['decoder_target_tokens'])  # [B, T] float32
    weights = batch['decoder_target_weights']
    return (token_nll * weights).sum(-1), weights.sum(-1)  # [B], [B]
  return nll


def sentence_losses(nll_of, variables, batches: list[dict], count: int) -> tuple[np.ndarray, np.ndarray]:
  """Teacher-forced NLL summed over each sentence's target tokens, and their count: [N] each.

  Args:
    nll_of: `_sentence_nll(model)`, compiled once per model and batch shape.
  """
  nll, tokens = np.zeros(count), np.zeros(count)
  for batch in batches:
    inputs = {key: value for key, value in batch.items() if key != 'example_index'}
    sums, counts = jax.device_get(nll_of(variables, inputs))
    real = batch['example_index'] >= 0
    nll[batch['example_index'][real]] = sums[real]
    tokens[batch['example_index'][real]] = counts[real]
  return nll, tokens


def bucket_scores(sources: list[str], hypotheses: list[str], references: list[str],
                  nll: np.ndarray, tokens: np.ndarray) -> list[dict]:
  """Per bucket: sentences, target tokens, loss per token and BLEU (None for an empty bucket)."""
  index = translating.source_buckets(sources, BUCKET_ENDS)
  rows = []
  for i, name in enumerate(bucket_names()):
    members = np.flatnonzero(index == i)
    rows.append({
        'source_words': name, 'sentences': len(members), 'target_tokens': int(tokens[members].sum()),
        'loss_per_token': float(nll[members].sum() / tokens[members].sum()) if len(members) else None,
        'bleu': translating.bleu([hypotheses[j] for j in members],
                                 [references[j] for j in members]) if len(members) else None})
  return rows


def score_run(workdir: str, splits: list[str], checkpoint: str = 'last') -> dict[str, list[dict]]:
  """Scores a trained run on whole `splits` by source length; writes RUN/length_buckets/<split>.json."""
  mesh = partitioning.make_mesh()
  run = trained_model.restore(workdir, None, checkpoint, mesh)
  for split in splits:  # every split named checked before any work
    datasets.check_split(run.data.dataset, split)
  nll_of = _sentence_nll(run.model)
  out = epath.Path(workdir) / OUT_DIR
  out.mkdir(parents=True, exist_ok=True)
  scored = {}
  for split in splits:
    batches = pipeline.make_eval_batches(run.data, run.vocabularies, split, run.data.eval_batch_size)
    text = datasets.load_split_text(run.data, split)
    nll, tokens = sentence_losses(nll_of, run.variables, batches, len(text.source))
    translator = translating.SplitTranslator(run.model, run.vocabularies.target, batches, mesh)
    hypotheses, _ = translator(run.variables)
    scored[split] = bucket_scores(text.source, hypotheses, text.reference, nll, tokens)
    (out / f'{split}.json').write_text(json.dumps({
        'split': split, 'checkpoint': checkpoint, 'checkpoint_steps': run.steps, 'decoding': 'greedy',
        'train_max_source_words': run.data.train_max_source_words, 'buckets': scored[split]},
        indent=2))
  return scored


def summarise(sweep_dir: str, split: str) -> list[dict]:
  """Per group of runs that differ only in seed: its swept values and, per bucket, mean and std."""
  runs, fields = results.load_runs(sweep_dir)
  groups = []
  for group in results.seed_groups(runs, fields):
    files = [epath.Path(sweep_dir) / run.name / OUT_DIR / f'{split}.json' for run in group]
    scored = [json.loads(path.read_text()) for path in files if path.is_file()]
    if not scored:
      continue
    buckets = []
    for i, name in enumerate(bucket_names()):
      row = {'source_words': name, 'sentences': scored[0]['buckets'][i]['sentences']}
      for metric in ('bleu', 'loss_per_token'):
        values = [s['buckets'][i][metric] for s in scored if s['buckets'][i][metric] is not None]
        row[metric], row[f'{metric}_std'] = results.mean_and_std(values) if values else (None, None)
      buckets.append(row)
    groups.append({'values': {field: group[0].values[field] for field in fields
                              if field != sweeps.SEED_FIELD},
                   'seeds': len(scored), 'trained_words': scored[0]['train_max_source_words'],
                   'buckets': buckets})
  return groups


def _name(values: dict) -> str:
  """'position=rope': the swept values, each field by its last name."""
  return ', '.join(f'{key.rsplit(".", 1)[-1]}={value}' for key, value in values.items())


def markdown(groups: list[dict], metric: str, spec: str) -> str:
  """A table: one row per group, one column per bucket, 'mean ± std'."""
  header = ['run', 'seeds', *bucket_names()]
  rows = [[_name(group['values']),
           str(group['seeds']),
           *(results.MISSING if b[metric] is None else results.spread_text(b[metric], b[f'{metric}_std'], spec)
             for b in group['buckets'])] for group in groups]
  sentences = ['sentences', '', *(str(b['sentences']) for b in groups[0]['buckets'])]
  return results.markdown(header, [*rows, sentences])


def _key(values: dict) -> str:
  return json.dumps(values, sort_keys=True)


def gaps(groups: list[dict], reference: list[dict], metric: str) -> list[dict]:
  """Per group that the reference sweep has too (same swept values): per bucket, the group's mean
  `metric` minus the reference group's (None where either has no value), and both seed counts."""
  reference_of = {_key(group['values']): group for group in reference}
  rows = []
  for group in groups:
    other = reference_of.get(_key(group['values']))
    if other is None:
      continue
    rows.append({'values': group['values'], 'seeds': group['seeds'], 'reference_seeds': other['seeds'],
                 'gaps': [None if mine[metric] is None or theirs[metric] is None else mine[metric] - theirs[metric]
                          for mine, theirs in zip(group['buckets'], other['buckets'])]})
  return rows


def gap_markdown(rows: list[dict], spec: str) -> str:
  """A table: one row per group, its seeds and the reference's, then the gap per bucket."""
  header = ['run', 'seeds', 'reference seeds', *bucket_names()]
  return results.markdown(header, [
      [_name(row['values']),
       str(row['seeds']), str(row['reference_seeds']),
       *(results.MISSING if gap is None else format(gap, '+' + spec) for gap in row['gaps'])]
      for row in rows])


def plot(groups: list[dict], split: str, path: str, reference: list[dict] = ()) -> None:
  """BLEU and loss per token against source length, mean ± std per group, trained range shaded;
  the reference sweep's matching groups dashed, in their group's colour."""
  figure = Figure(figsize=(11, 4), layout='constrained')
  axes = figure.subplots(1, 2)
  trained = groups[0]['trained_words']
  # Buckets wholly inside the trained range: their upper end is at most k words.
  inside = sum(1 for end in BUCKET_ENDS if trained and end <= trained)
  reference_of = {_key(group['values']): group for group in reference}
  for ax, (metric, axis_label) in zip(axes, (('bleu', 'BLEU (greedy)'),
                                             ('loss_per_token', 'loss per target token'))):
    if inside:
      ax.axvspan(-0.5, inside - 0.5, color='grey', alpha=0.15, label=f'trained: sources <= {trained} words')
    for i, group in enumerate(groups):
      xs = [x for x, b in enumerate(group['buckets']) if b[metric] is not None]
      ys = np.array([group['buckets'][x][metric] for x in xs])
      stds = np.array([group['buckets'][x][f'{metric}_std'] or 0.0 for x in xs])
      color = colormaps['tab10'](i % 10)
      name = ', '.join(f'{value}' for value in group['values'].values())
      ax.plot(xs, ys, marker='o', color=color, label=f'{name} ({group["seeds"]} seeds)')
      ax.fill_between(xs, ys - stds, ys + stds, color=color, alpha=0.2, linewidth=0)
      other = reference_of.get(_key(group['values']))
      if other is not None:
        xs = [x for x, b in enumerate(other['buckets']) if b[metric] is not None]
        ax.plot(xs, [other['buckets'][x][metric] for x in xs], linestyle='--', color=color,
                label=f'{name}, all lengths ({other["seeds"]} seeds)')
    ax.set_xticks(range(len(BUCKET_ENDS) + 1), bucket_names())
    ax.set_xlabel(f'source length in words ({split})')
    ax.set_ylabel(f'{axis_label}, mean ± std over seeds')
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize='small')
  image = io.BytesIO()
  figure.savefig(image, format='png', dpi=100)
  epath.Path(path).write_bytes(image.getvalue())


def write_summary(sweep_dir: str, splits: list[str], out_dir: str, reference_dir: str | None = None) -> list[str]:
  """length_extrapolation.md and one PNG per split in `out_dir`; returns the paths written.

  Args:
    reference_dir: a sweep of the same models trained on all lengths: adds each bucket's gap to it.
  """
  lines, written = [f'# Length extrapolation: {sweep_dir}', ''], []
  for split in splits:
    groups = summarise(sweep_dir, split)
    if not groups:
      raise ValueError(f'{sweep_dir}: no run has {OUT_DIR}/{split}.json; score the runs first')
    reference = summarise(reference_dir, split) if reference_dir else []
    loss_gaps, bleu_gaps = (gaps(groups, reference, metric) for metric in ('loss_per_token', 'bleu'))
    if reference_dir and not loss_gaps:
      raise ValueError(f'reference {reference_dir}: none of its scored runs ({split}) has the swept values '
                       f'of a run of {sweep_dir}')
    image = os.path.join(out_dir, f'length_{split}.png')
    plot(groups, split, image, reference)
    written.append(image)
    lines += [f'## {split}: BLEU (greedy) by source words, mean ± sample std over seeds', '',
              markdown(groups, 'bleu', '.2f'), f'## {split}: loss per target token', '',
              markdown(groups, 'loss_per_token', '.3f')]
    if reference_dir:
      lines += [f'## {split}: gap to the same model trained on all lengths ({reference_dir}), '
                'difference of means', '', 'Loss per target token:', '',
                gap_markdown(loss_gaps, '.3f'), 'BLEU (greedy):', '', gap_markdown(bleu_gaps, '.2f')]
    lines += [f'![{split}](length_{split}.png)', '']
  path = os.path.join(out_dir, 'length_extrapolation.md')
  epath.Path(path).write_text('\n'.join(lines))
  return [path, *written]
