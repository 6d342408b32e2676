"""scripts/benchmark.py end to end: consistent figures, and a JSON and summary that hold them all.

Run as a process: the script defines absl flags that other scripts' tests define too.
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_report_is_consistent_and_summarised(tmp_path):
  out = tmp_path / 'bench.json'
  batch_size, target_length = 4, 5
  result = subprocess.run(
      [sys.executable, '-m', 'scripts.benchmark', '--config=configs/smoke.py',
       '--config.train.loss_chunk_tokens=8', '--vocab_size=64', f'--batch_size={batch_size}',
       '--source_length=6', f'--target_length={target_length}', '--steps=2', '--warmup=1',
       '--decode_batch_size=2', '--decode_repeats=1', '--beam_size=2', f'--out={out}'],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  report = json.loads(out.read_text())
  # Every synthetic target token is real, so tokens/s is the batch's tokens over the median step.
  assert report['train_tokens_per_sec'] == (batch_size * target_length
                                            / report['train_step_seconds'])
  assert report['achieved_tflops'] == (report['train_step_flops'] / report['train_step_seconds']
                                       / 1e12)
  assert report['train_step_temp_mb'] > 0
  assert report['loss_chunk_tokens'] == 8
  assert set(report['decode_sentences_per_sec']) == {'greedy', 'beam2'}
  assert '(loss chunks 8)' in result.stdout
  assert f"{report['train_step_temp_mb']:,.0f} MB" in result.stdout
