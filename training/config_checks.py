"""Checks of the whole experiment config that run before anything is built or compiled."""

import math

import ml_collections

from data import datasets, tokenizer, vocabularies
from model.config import ModelConfig
from training import time_budget
from training.optimizer import make_optimizer


_POSITIVE_INTS = {
    'train': ('log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints', 'steps_per_call'),
    'data': ('vocab_size', 'max_length', 'max_tokens', 'eval_batch_size'),
    'eval': ('beam_size',),
}
# Counts where 0 means none, all, or off (each field's comment in configs/base.py says which).
_COUNTS = {
    'train': ('num_steps', 'num_epochs', 'loss_chunk_tokens', 'profile_steps'),
    'optim': ('warmup_steps',),
    'data': ('eval_examples', 'num_workers'),
}
_SECTIONS = ('model', 'data', 'optim', 'train', 'eval')


def _is_int(value) -> bool:
  """An int that is not a bool: a flag's True would otherwise pass as 1."""
  return isinstance(value, int) and not isinstance(value, bool)


def check_config(config: ml_collections.ConfigDict) -> datasets.DataSpec:
  """Raises ValueError with a one-line message naming the first bad field; returns the data spec
  of `config.data` (`datasets.resolve`, which checks the dataset, languages and eval split).

  Runs before train.py writes anything: every field whose bad value would otherwise fail later
  (optimizer, schedule, model, batching) is checked here.
  """
  missing = [name for name in _SECTIONS if name not in config]
  if missing:
    raise ValueError(f'config lacks sections: {", ".join(missing)}')
  for section in _SECTIONS:
    for name, value in config[section].items():
      if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f'config.{section}.{name}={value!r} must be a finite number')
  for section, names in _POSITIVE_INTS.items():
    for name in names:
      value = config[section][name]
      if not _is_int(value) or value < 1:
        raise ValueError(f'config.{section}.{name}={value!r} must be a positive integer')
  train = config.train
  for section, names in _COUNTS.items():
    for name in names:
      value = config[section][name]
      if not _is_int(value) or value < 0:
        raise ValueError(f'config.{section}.{name}={value!r} must be an integer >= 0')
  if not (train.num_steps or train.num_epochs):
    raise ValueError(f'config.train.num_steps={train.num_steps} / num_epochs={train.num_epochs}: '
                     'set one of them to a positive number')
  time_budget.check(train.time_budget_minutes, config.optim.warmup_steps)
  if not 0.0 <= train.label_smoothing < 1.0:
    raise ValueError(f'config.train.label_smoothing={train.label_smoothing!r} must be in [0, 1)')
  microbatch = train.microbatch_tokens
  if microbatch is not None and (not _is_int(microbatch) or microbatch < 0):
    raise ValueError(f'config.train.microbatch_tokens={microbatch!r} must be None (by platform), 0 '
                     '(the whole batch) or a positive number of tokens')
  if microbatch and config.model.norm == 'batch':
    raise ValueError(f'config.train.microbatch_tokens={microbatch} with config.model.norm=\'batch\': '
                     'BatchNorm normalises over the whole batch; set microbatch_tokens=0')
  if config.data.max_tokens < config.data.max_length:
    raise ValueError(f'config.data.max_tokens={config.data.max_tokens} is smaller than '
                     f'config.data.max_length={config.data.max_length}: no long pair would fit a batch')
  pack_length = config.data.pack_length
  if not _is_int(pack_length) or not 0 <= pack_length <= config.data.max_tokens:
    raise ValueError(f'config.data.pack_length={pack_length!r} must be 0 (no packing) or a row '
                     f'length up to config.data.max_tokens={config.data.max_tokens}')
  words = config.data.train_max_source_words
  if not _is_int(words) or words < 0:
    raise ValueError(f'config.data.train_max_source_words={words!r} must be 0 (no limit) or a '
                     'positive number of words')
  if config.optim.learning_rate <= 0:
    raise ValueError(f'config.optim.learning_rate={config.optim.learning_rate!r} must be positive')
  # Builds the optimizer once (cheap, no arrays) for its own checks of names and values; with
  # num_epochs the run's length is not known yet, so any length past the warmup stands in.
  length = train.num_steps if not train.num_epochs else max(config.optim.warmup_steps, 0) + 1
  make_optimizer(config.optim, steps_per_epoch=1, total_steps=length)
  if config.data.vocab_type not in tokenizer.VOCAB_TYPES:
    raise ValueError(f'config.data.vocab_type={config.data.vocab_type!r} is not one of: '
                     f'{", ".join(tokenizer.VOCAB_TYPES)}')
  check_subword_sampling(config.data)
  if not _is_int(train.save_on_stop_after) or train.save_on_stop_after < 0:
    raise ValueError(f'config.train.save_on_stop_after={train.save_on_stop_after!r} must be an '
                     'integer >= 0 (0: never save on a stop signal)')
  if train.divergence_loss_ceiling < 0:
    raise ValueError(f'config.train.divergence_loss_ceiling={train.divergence_loss_ceiling!r} must '
                     'be >= 0 (0 disables)')
  if train.divergence_growth != 0 and train.divergence_growth <= 1:
    raise ValueError(f'config.train.divergence_growth={train.divergence_growth!r} must be above 1, '
                     'or 0 to disable')
  # The data and model layers' own checks last.
  data = datasets.resolve(config.data)
  vocabularies.check_vocabulary(config.data)
  if config.data.vocabulary == 'separate' and config.model.share_embeddings:
    raise ValueError("config.data.vocabulary='separate' gives each language its own token ids, so "
                     'config.model.share_embeddings=True would embed two words with one vector; set '
                     'it to False')
  vocab = config.data.vocab_size
  ModelConfig.from_config(config.model, source_vocab_size=vocab, target_vocab_size=vocab)
  return data


def check_subword_sampling(data_config) -> None:
  """Raises ValueError naming the first bad subword-regularization field of `config.data`."""
  samples, alpha, nbest = (data_config.subword_samples, data_config.subword_alpha,
                           data_config.subword_nbest)
  if not _is_int(samples) or samples < 0:
    raise ValueError(f'config.data.subword_samples={samples!r} must be 0 (the best segmentation) '
                     'or a positive number of sampled copies of the training set')
  if not samples:
    return
  if data_config.vocab_type == 'bpe' and not 0 < alpha < 1:
    raise ValueError(f'config.data.subword_alpha={alpha!r} is BPE-dropout\'s merge dropout '
                     'probability here (vocab_type \'bpe\'): it must be in (0, 1)')
  if not alpha > 0:
    raise ValueError(f'config.data.subword_alpha={alpha!r} must be positive (unigram smoothing)')
  if not _is_int(nbest) or not (nbest == -1 or nbest > 1):
    raise ValueError(f'config.data.subword_nbest={nbest!r} must be -1 (every segmentation) or '
                     'above 1 (sentencepiece does not sample from 0 or 1 best)')

