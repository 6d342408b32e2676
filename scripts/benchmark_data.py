"""Measures the training input pipeline: examples/s, tokens/s, batch shapes.

The config is configs/base.py's; flags override a few data fields. The raw
files come from --source_dir, else $SEQ2SEQ_DATA_DIR/<dataset>, else a
download; preparing the dataset and training the tokenizer on first use are
timed apart from the pipeline.

  python scripts/benchmark_data.py --max_tokens=4096 --num_batches=2000
"""

import argparse
from pathlib import Path
import sys
import time

import numpy as np

# Run as a script from anywhere: the repository root holds configs/ and data/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs import base  # pylint: disable=g-import-not-at-top
from data import pipeline  # pylint: disable=g-import-not-at-top
from data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--dataset', default='multi30k')
  parser.add_argument('--max_tokens', type=int, default=4096)
  parser.add_argument('--num_batches', type=int, default=2000)
  parser.add_argument('--num_workers', type=int, default=0)
  parser.add_argument('--source_dir', default='')
  parser.add_argument('--cache_dir', default='')
  args = parser.parse_args()

  config = base.get_config().data
  config.dataset = args.dataset
  config.max_tokens = args.max_tokens
  config.num_workers = args.num_workers
  config.source_dir = args.source_dir
  config.cache_dir = args.cache_dir

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
  for _ in range(args.num_batches):
    batch = next(iterator)
    tokens = batch['encoder_input_tokens']
    examples += int(np.sum(batch['example_index'] >= 0))
    real_tokens += int(np.count_nonzero(tokens) +
                       batch['decoder_target_weights'].sum())
    padded_tokens += 2 * tokens.size
    shapes.add(tokens.shape)
  seconds = time.perf_counter() - start

  print(f'{args.num_batches} batches (max_tokens={config.max_tokens}) in '
        f'{seconds:.2f} s')
  print(f'examples/s: {examples / seconds:,.0f}')
  print(f'tokens/s (source + target, no padding): {real_tokens / seconds:,.0f}')
  print(f'padded tokens/s: {padded_tokens / seconds:,.0f} '
        f'({real_tokens / padded_tokens:.0%} of them real)')
  print(f'distinct batch shapes: {len(shapes)}: {sorted(shapes)}')


if __name__ == '__main__':
  main()
