"""Measures the training input pipeline: examples/s, tokens/s, batch shapes.

The data fields come from --config (configs/base.py by default) and its overrides. The raw
files come from config.data.source_dir, else $SEQ2SEQ_DATA_DIR/<dataset>, else a download;
preparing the dataset and training the tokenizer on first use are timed apart from the pipeline.

  python scripts/benchmark_data.py --config=configs/multi30k.py --config.data.max_tokens=4096 \
      --num_batches=2000
"""

from pathlib import Path
import sys
import time

from absl import app, flags
from ml_collections import config_flags
import numpy as np

# Run as a script from anywhere: the repository root holds configs/ and data/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data import pipeline  # pylint: disable=g-import-not-at-top
from data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

_CONFIG = config_flags.DEFINE_config_file(
    'config', str(Path(__file__).resolve().parents[1] / 'configs' / 'base.py'),
    'Config file[:preset]; only its data section is used.')
NUM_BATCHES = flags.DEFINE_integer('num_batches', 2000, 'Batches to time.', lower_bound=1)


def main(argv) -> None:
  del argv
  config = _CONFIG.value.data
  start = time.perf_counter()
  tokenizer = tokenizer_lib.get_tokenizer(config)
  print(f'tokenizer ({config.vocab_type}, {tokenizer.vocab_size} pieces): '
        f'{time.perf_counter() - start:.2f} s (includes preparing the data '
        'and training on first use)')
  start = time.perf_counter()
  iterator = pipeline.make_train_iterator(config, tokenizer, seed=0)
  print(f'iterator: {time.perf_counter() - start:.2f} s, '
        f'{iterator.batches_per_epoch} batches per epoch, '
        f'{iterator.num_filtered} pairs over max_length={config.max_length}')

  examples = real_tokens = padded_tokens = 0
  shapes = set()
  start = time.perf_counter()
  for _ in range(NUM_BATCHES.value):
    batch = next(iterator)
    tokens = batch['encoder_input_tokens']
    examples += int(np.sum(batch['example_index'] >= 0))
    real_tokens += int(np.count_nonzero(tokens) +
                       batch['decoder_target_weights'].sum())
    padded_tokens += 2 * tokens.size
    shapes.add(tokens.shape)
  seconds = time.perf_counter() - start

  print(f'{NUM_BATCHES.value} batches (max_tokens={config.max_tokens}) in '
        f'{seconds:.2f} s')
  print(f'examples/s: {examples / seconds:,.0f}')
  print(f'tokens/s (source + target, no padding): {real_tokens / seconds:,.0f}')
  print(f'padded tokens/s: {padded_tokens / seconds:,.0f} '
        f'({real_tokens / padded_tokens:.0%} of them real)')
  print(f'distinct batch shapes: {len(shapes)}: {sorted(shapes)}')


if __name__ == '__main__':
  app.run(main)
