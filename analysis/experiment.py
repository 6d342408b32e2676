"""What the analysis scripts share: their command line, real sentence pairs, the model at init.

Every script takes `--config=FILE[:preset]` with `--config.x=y` overrides, as train.py does, and
`--out=FILE.json`; its plot goes beside the JSON, same stem, `.png`. Data come through
`config.data` (dataset, direction, tokenizer, cache) exactly as in training.

The model is `config.model` with the script's choices on top (layer counts, norm placement),
initialised by train.py's `create_train_state` (so seed s is the initialisation a run with
`--config.train.seed=s` starts from), and applied with `train=False`:
no dropout, so what is measured is a property of the initialisation and the data rather than of
one dropout draw; BatchNorm normalises with its initial running statistics (mean 0, variance 1).

Dimensions: B pairs, S source length, T target length.
"""

import json
from pathlib import Path

from absl import flags
import ml_collections
import numpy as np
import optax

from data import batching, datasets, pipeline
from data import tokenizer as tokenizer_lib
from data import vocabularies as vocabularies_lib
from model import losses
from model.transformer import Transformer
from training import command_line, train_state

# What the model reads from a batch (pipeline.py's names).
MODEL_INPUTS = ('encoder_input_tokens', 'decoder_input_tokens', 'decoder_target_tokens',
                'decoder_target_weights')


def define_flags() -> None:
  """--config and --out; scripts call this (and define their own flags) only when run as scripts,
  so that importing several of them, as the tests do, defines no flag twice."""
  command_line.define_config_flag()
  flags.DEFINE_string('out', None, 'Output .json path; the plot is written beside it as .png.')
  flags.mark_flags_as_required(['out'])


def config_and_out() -> tuple[ml_collections.ConfigDict, Path]:
  """The parsed --config, checked as train.py checks it, and --out."""
  config = command_line.config_from_flags()
  out = Path(flags.FLAGS.out)
  if out.suffix != '.json':
    raise SystemExit(f'invalid command line: --out={out} must name a .json file')
  return config, out


def int_list(flag_name: str, values: list[str], minimum: int = 1) -> list[int]:
  """A comma-separated list flag as integers >= `minimum`, or a one-line error naming the flag."""
  try:
    numbers = [int(value) for value in values]
  except ValueError:
    numbers = []
  if not numbers or min(numbers) < minimum:
    raise SystemExit(f'invalid command line: --{flag_name}={",".join(values)} must be integers '
                     f'>= {minimum}')
  return numbers


def with_model(config: ml_collections.ConfigDict, **model_fields) -> ml_collections.ConfigDict:
  """A copy of `config` with `config.model` fields replaced (layer counts, placement, ...)."""
  config = config.copy_and_resolve_references()
  config.model.update(model_fields)
  return config


def resolved(config: ml_collections.ConfigDict) -> dict:
  """The config as plain JSON, recorded in every output so a result names what produced it."""
  return json.loads(config.to_json_best_effort())


def load_batches(data_config: ml_collections.ConfigDict, split: str, num_pairs: int,
                 batch_size: int) -> tuple[int, list[dict[str, np.ndarray]]]:
  """The first `num_pairs` pairs of `split`, regrouped by length into batches of `batch_size`.

  Sorting by length before batching cuts padding, hence compute, and the number of distinct
  shapes, hence compilations; a sum over tokens (loss, gradient, Hessian) does not depend on
  how the pairs are grouped.

  Raises:
    ValueError: for a split with fewer pairs, or vocabularies other than one joint vocabulary (the
      analyses build their models for one size).

  Returns:
    The vocabulary size and batches of `MODEL_INPUTS`, each trimmed to its longest pair
    rounded up to 8 tokens.
  """
  if data_config.vocabulary != 'joint':
    raise ValueError(f'config.data.vocabulary={data_config.vocabulary!r}: the analyses build their '
                     "models for one joint vocabulary; use 'joint'")
  data = datasets.resolve(data_config)
  vocabularies = vocabularies_lib.get_vocabularies(data)
  pairs = pipeline.make_eval_batches(data, vocabularies, split, num_pairs, examples=num_pairs)[0]
  available = int((pairs['example_index'] >= 0).sum())
  if available < num_pairs:
    raise ValueError(f'{data.dataset} split {split!r} has {available} pairs, fewer than '
                     f'the {num_pairs} asked for')
  source_lengths = (pairs['encoder_input_tokens'] != tokenizer_lib.PAD_ID).sum(1)  # [B]
  target_lengths = pairs['decoder_target_weights'].sum(1).astype(int)  # [B]
  order = np.argsort(np.maximum(source_lengths, target_lengths), kind='stable')
  batches = []
  for start in range(0, num_pairs, batch_size):
    rows = order[start:start + batch_size]
    source_length = batching.round_up(int(source_lengths[rows].max()), 8)
    target_length = batching.round_up(int(target_lengths[rows].max()), 8)
    batches.append({
        name: pairs[name][rows, :source_length if name == 'encoder_input_tokens' else target_length]
        for name in MODEL_INPUTS})
  return vocabularies.source.vocab_size, batches


def load_batches_or_exit(data_config: ml_collections.ConfigDict, split: str, num_pairs: int,
                         batch_size: int) -> tuple[int, list[dict[str, np.ndarray]]]:
  """`load_batches` for a command line: an unknown split or too few pairs is a one-line error."""
  try:
    return load_batches(data_config, split, num_pairs, batch_size)
  except ValueError as error:
    raise SystemExit(f'invalid command line: {command_line.one_line_error(error)}') from None


def init_variables(model: Transformer, seed: int) -> dict:
  """The variables train.py starts a run with `--config.train.seed=seed` from (eager: compiling the
  init of a 14+14 model takes longer, ~45 s on 2 CPU cores, than running it for ten seeds)."""
  state = train_state.create_train_state(model, optax.identity(), seed)
  return train_state.model_variables(state.params, state.batch_stats)


def loss_sums(model: Transformer, variables: dict, batch: dict, label_smoothing: float) -> dict:
  """train.py's training loss terms on `batch` without dropout: {'loss', 'nll', 'tokens', ...} sums."""
  logits = model.apply(variables, batch['encoder_input_tokens'], batch['decoder_input_tokens'],
                       train=False)  # [B, T, V]
  return losses.weighted_sums(logits, batch['decoder_target_tokens'], batch['decoder_target_weights'],
                              label_smoothing)


def write(out: Path, results: dict, figure) -> None:
  """Writes `results` to `out` (JSON) and `figure` beside it (PNG)."""
  out.parent.mkdir(parents=True, exist_ok=True)
  with open(out, 'w') as f:
    json.dump(results, f, indent=2)
  figure.savefig(out.with_suffix('.png'), dpi=120, bbox_inches='tight')
