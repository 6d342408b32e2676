"""scripts/benchmark.py's report: consistent figures, and a summary and JSON that hold them all."""

import json

from configs import smoke
from scripts import benchmark


def test_report_is_consistent_and_summarised():
  config = smoke.get_config()
  config.train.loss_chunk_tokens = 8
  batch_size, source_length, target_length = 4, 6, 5
  report = benchmark.measure(
      config, vocab_size=64, batch_size=batch_size, source_length=source_length,
      target_length=target_length, steps=2, warmup=1, decode_batch_size=2, decode_repeats=1,
      beam_size=2)
  # Every synthetic target token is real, so tokens/s is the batch's tokens over the median step.
  assert report['train_tokens_per_sec'] == (batch_size * target_length
                                            / report['train_step_seconds'])
  assert report['achieved_tflops'] == (report['train_step_flops'] / report['train_step_seconds']
                                       / 1e12)
  assert report['train_step_temp_mb'] > 0
  assert report['loss_chunk_tokens'] == 8
  assert set(report['decode']) == {'greedy', 'beam2'}
  text = benchmark.summary(report)
  assert '(loss chunks 8)' in text and f"{report['train_step_temp_mb']:,.0f} MB" in text
  assert json.loads(json.dumps(report)) == report
