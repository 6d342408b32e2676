"""A tiny Multi30k model that trains for a few steps in about a minute on a CPU: for tests and checks.

  python train.py --config=configs/smoke.py --workdir=/tmp/smoke
"""

from configs import base


def get_config():
  config = base.get_config()
  config.model.update(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1,
                      dropout_rate=0.1)
  # BPE trains in ~1 s (unigram ~20 s). Packed rows of 32 tokens give one training shape, hence one
  # compilation (bucketed batches would give four); pack_length=0 brings the buckets back.
  config.data.update(vocab_size=1000, vocab_type='bpe', max_length=32, max_tokens=1024, pack_length=32,
                     eval_batch_size=32, eval_examples=64)
  config.optim.update(learning_rate=3e-3, warmup_steps=10)
  config.train.update(num_steps=40, log_every=10, eval_every=20, checkpoint_every=20,
                      keep_checkpoints=2)
  return config
