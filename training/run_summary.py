"""The console's opening lines of a run: the data it trains on and the model it trains.

Kept out of training/run_log.py, which sweeps and scripts import without loading the model or the
data.
"""

import jax

from data import datasets, pipeline, vocabularies as vocabularies_lib
from model import flops as flops_lib
from model.transformer import Transformer


def describe_data(data: datasets.DataSpec, train_iter: pipeline.TrainIterator,
                  vocabularies: vocabularies_lib.Vocabularies) -> str:
  """The console's line about the prepared data."""
  packing = f', packed into rows of {data.pack_length} tokens' if data.pack_length else ''
  samples = data.subword_samples
  sampled = f' ({samples} sampled segmentations of each)' if samples else ''
  short = (f', {train_iter.num_long_sources:,} with sources of more than '
           f'{data.train_max_source_words} words' if data.train_max_source_words else '')
  return (f'data: {data.dataset} {data.source_lang}->{data.target_lang}, {train_iter.num_pairs:,} '
          f'training pairs{sampled} in {train_iter.batches_per_epoch} batches per epoch{packing} '
          f'({train_iter.num_filtered} longer than max_length={data.max_length}{short} left out), '
          f'{vocabularies.describe()}; cached in {data.cache_dir}')


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
