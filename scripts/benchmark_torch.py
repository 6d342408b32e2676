"""The PyTorch reference for scripts/benchmark.py: eager `torch.nn.Transformer` doing the same work.

  pip install torch==2.13.0     # benchmark-only; not in requirements.txt
  python -m scripts.benchmark_torch --out=/tmp/torch.json

Same shape and work as `scripts/benchmark.py --config=configs/multi30k.py:de_en_small --config.model.d_ff=512
--config.model.num_heads=8 --config.model.dropout_rate=0.1 --vocab_size=10000`: 3+3 Post-LN layers,
d_model 256, FFN 512, 8 heads, dropout 0.1, separate source and target embeddings (scaled by
sqrt(d_model)) plus sinusoidal positions, an untied 10000-way output projection, label-smoothed
(0.1) cross entropy, Adam; fixed synthetic batches with no padding, median step time after
warm-up. Intra-op threads default to torch's choice (one per core).
"""

import json
import math
from pathlib import Path
import resource
import statistics
import time

from absl import app, flags
import torch
from torch import nn


class Seq2Seq(nn.Module):
  def __init__(self, vocab_size, d_model, num_heads, d_ff, layers, dropout, max_length=256):
    super().__init__()
    self.d_model = d_model
    self.source_embedding = nn.Embedding(vocab_size, d_model)
    self.target_embedding = nn.Embedding(vocab_size, d_model)
    position = torch.arange(max_length)[:, None]
    inverse_frequency = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_length, d_model)
    table[:, 0::2] = torch.sin(position * inverse_frequency)
    table[:, 1::2] = torch.cos(position * inverse_frequency)
    self.register_buffer('positions', table)
    self.dropout = nn.Dropout(dropout)
    self.transformer = nn.Transformer(d_model, num_heads, layers, layers, d_ff, dropout,
                                      batch_first=True)
    self.output = nn.Linear(d_model, vocab_size, bias=False)

  def embed(self, embedding, tokens):
    x = embedding(tokens) * math.sqrt(self.d_model) + self.positions[:tokens.shape[1]]
    return self.dropout(x)

  def forward(self, source, decoder_input):
    causal = nn.Transformer.generate_square_subsequent_mask(decoder_input.shape[1])
    hidden = self.transformer(self.embed(self.source_embedding, source),
                              self.embed(self.target_embedding, decoder_input), tgt_mask=causal,
                              tgt_is_causal=True)
    return self.output(hidden)


def measure(args) -> dict:
  torch.manual_seed(0)
  model = Seq2Seq(args.vocab_size, args.d_model, args.num_heads, args.d_ff, args.layers, args.dropout)
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
  loss_fn = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
  generator = torch.Generator().manual_seed(0)
  words = lambda length: torch.randint(4, args.vocab_size, (args.batch_size, length), generator=generator)
  source, target = words(args.source_length), words(args.target_length)
  decoder_input = torch.cat([torch.full((args.batch_size, 1), 2), target[:, :-1]], 1)

  def step():
    optimizer.zero_grad(set_to_none=True)
    logits = model(source, decoder_input)  # [B, T, V]
    loss = loss_fn(logits.reshape(-1, args.vocab_size), target.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.item()

  model.train()
  for _ in range(args.warmup):
    step()
  times = []
  for _ in range(args.steps):
    start = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - start)
  step_seconds = statistics.median(times)
  return {'framework': f'torch {torch.__version__} eager, {torch.get_num_threads()} threads',
          'shape': {'batch_size': args.batch_size, 'source_length': args.source_length,
                    'target_length': args.target_length, 'vocab_size': args.vocab_size},
          'train_tokens_per_sec': args.batch_size * args.target_length / step_seconds,
          'train_step_seconds': step_seconds, 'train_step_seconds_all': times,
          'final_train_loss': loss,
          'peak_rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


_FLAGS = {
    'batch_size': (256, 'Sentences per batch.'),
    'source_length': (16, 'Source tokens per sentence.'),
    'target_length': (16, 'Target tokens per sentence.'),
    'vocab_size': (10000, 'Source and target vocabulary.'),
    'd_model': (256, 'Model width.'),
    'num_heads': (8, 'Attention heads.'),
    'd_ff': (512, 'Feed-forward width.'),
    'layers': (3, 'Encoder and decoder layers (each).'),
    'steps': (10, 'Timed training steps.'),
    'warmup': (2, 'Untimed steps first.'),
}
for _name, (_default, _help) in _FLAGS.items():
  flags.DEFINE_integer(_name, _default, _help, lower_bound=1)
flags.DEFINE_float('dropout', 0.1, 'Dropout rate.')
flags.DEFINE_float('label_smoothing', 0.1, 'Label smoothing of the cross entropy.')
flags.DEFINE_string('out', '', 'Write the measurements here as JSON.')


def main(argv) -> None:
  del argv
  args = flags.FLAGS
  report = measure(args)
  print(f"{report['framework']}: {report['train_tokens_per_sec']:,.0f} target tokens/s, "
        f"{report['train_step_seconds'] * 1e3:,.1f} ms/step (median of {args.steps}), "
        f"peak RSS {report['peak_rss_mb']:,.0f} MB")
  if args.out:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == '__main__':
  app.run(main)
