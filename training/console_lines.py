"""The console's lines about a run: its data, its model and length, each validation, its plans."""

import jax

from data import datasets, pipeline, vocabularies as vocabularies_lib
from model import flops as flops_lib
from model.transformer import Transformer
from training.budget_plan import BudgetPlan


def describe_data(data_config, train_iter: pipeline.TrainIterator,
                  vocabularies: vocabularies_lib.Vocabularies) -> str:
  """The console's line about the prepared data."""
  source, target = datasets.language_pair(data_config)
  packing = (f', packed into rows of {data_config.pack_length} tokens'
             if data_config.pack_length else '')
  samples = data_config.subword_samples
  sampled = f' ({samples} sampled segmentations of each)' if samples else ''
  short = (f', {train_iter.num_long_sources:,} with sources of more than '
           f'{data_config.train_max_source_words} words' if data_config.train_max_source_words else '')
  return (f'data: {data_config.dataset} {source}->{target}, {train_iter.num_pairs:,} training pairs{sampled} '
          f'in {train_iter.batches_per_epoch} batches per epoch{packing} ({train_iter.num_filtered} '
          f'longer than max_length={data_config.max_length}{short} left out), '
          f'{vocabularies.describe()}; cached in {datasets.cache_dir(data_config)}')


def describe_model(model: Transformer, params, length: str, resumed_from: int | None,
                   microbatch_tokens: int = 0) -> str:
  """The console's line about the model, how a step is computed and the run's length."""
  cfg = model.config
  parameters = sum(leaf.size for leaf in jax.tree.leaves(params))
  # Per target token of a training step on 32-token pairs (FLOPs grow with length).
  flops = flops_lib.train_step_flops(cfg, 1, 32, 32) / 32
  start = f'resuming at step {resumed_from}' if resumed_from is not None else 'starting'
  slices = (f', each step in slices of ~{microbatch_tokens} tokens (train.microbatch_tokens)'
            if microbatch_tokens else '')
  return (f'model: {cfg.num_encoder_layers}+{cfg.num_decoder_layers} layers, d_model {cfg.d_model}, '
          f'{parameters / 1e6:.2f}M parameters, {flops / 1e6:.3g} MFLOP per target token to train'
          f'{slices}; {start}, {length}')


def describe_validation(step: int, metrics: dict, best: dict) -> str:
  """The console's line for one validation; updates `best` (lowest eval_loss, highest bleu)."""
  best['eval_loss'] = min(best['eval_loss'], metrics['eval_loss'])
  best['bleu'] = max(best['bleu'], metrics['bleu'])
  return (f'step {step}: validation loss {metrics["eval_loss"]:.3f} (best {best["eval_loss"]:.3f}), '
          f'greedy BLEU {metrics["bleu"]:.2f} (best {best["bleu"]:.2f})')


def describe_plan(plan: BudgetPlan, step: int, *, budget_minutes: float, elapsed_seconds: float,
                  before: int | None, eval_compile_seconds: float = 0.0) -> str | None:
  """The console's line for a budgeted run's plan at `step`: the first (before None), or a later
  one that moved the end from `before`; None for a later one that kept it."""
  costs, end = plan.costs, plan.end_step
  spent = f'time budget {budget_minutes} min: {elapsed_seconds / 60:.1f} min spent by step {step}'
  ends = f'after ~{(elapsed_seconds + plan.seconds_left(step)) / 60:.1f} min'
  if before is None:
    return (f'{spent}; a step takes {costs.step_seconds:.3f} s, a validation '
            f'{costs.eval_seconds:.1f} s (the first also compiled for {eval_compile_seconds:.1f} s), '
            f'a checkpoint {costs.save_seconds:.1f} s: the run ends at step {end} of at most '
            f'{plan.max_steps}, {ends}')
  if end == before:
    return None
  return (f'{spent}; steps took {costs.step_seconds:.3f} s since the last plan, so the run ends at '
          f'step {end} instead of {before}, {ends}; the rest of the schedule is '
          f'{"stretched" if end > before else "squeezed"} to end there')
