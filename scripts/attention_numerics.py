"""A fused attention kernel against the XLA einsum path: loss, gradient norm and logits on one batch.

  XLA_FLAGS=--xla_gpu_enable_triton_gemm=false python -m scripts.attention_numerics \
      --config=configs/iwslt14.py --config.model.num_encoder_layers=2 \
      --config.model.num_decoder_layers=2                  # on a GPU; --fused_impl=jax on a CPU

The config's model (above, the IWSLT model cut to 2+2 layers, which compiles faster and makes
the same attention calls) on 64 random sentence pairs padded to 32 tokens from real lengths of
8-32. Three runs from the same parameters: float32 with XLA attention (the reference), bfloat16 with XLA
attention, and bfloat16 with the fused kernel (`--fused_impl`, default cuDNN). The fused kernel is
as good as the XLA path where its distance to the reference is that of the XLA path in the same
dtype. A measurement to read, not a test: cuDNN's kernel exists only on NVIDIA GPUs.
"""

from absl import app, flags
import jax
import numpy as np
import optax

from model import losses
from model.special_tokens import EOS_ID, PAD_ID
from model.transformer import Transformer
from scripts.benchmark import synthetic_batch  # also defines --config
from training import command_line, run_log, train_state

FUSED_IMPL = flags.DEFINE_enum('fused_impl', 'cudnn', ['cudnn', 'jax'],
                               'Fused attention kernel compared with the XLA path.')


def padded_batch(vocab_size: int, rows: int = 64, length: int = 32, seed: int = 3) -> dict[str, np.ndarray]:
  """Random pairs of real lengths 8..length, EOS-terminated and padded to `length`."""
  batch = synthetic_batch(rows, length, length, vocab_size)
  rng = np.random.default_rng(seed)
  for row in range(rows):
    source_length, target_length = rng.integers(8, length + 1, 2)
    batch['encoder_input_tokens'][row, source_length:] = PAD_ID
    batch['encoder_input_tokens'][row, source_length - 1] = EOS_ID
    for name in ('decoder_input_tokens', 'decoder_target_tokens'):
      batch[name][row, target_length:] = PAD_ID
    batch['decoder_target_weights'][row, target_length:] = 0.0
  return batch


def loss_grad_norm_logits(config, dtype: str, attention_impl: str,
                          batch: dict) -> tuple[float, float, np.ndarray]:
  """Mean NLL over real target tokens, the global gradient norm, and float32 logits [B, T, V]."""
  config = config.copy_and_resolve_references()
  config.model.update(dtype=dtype, attention_impl=attention_impl)
  model = Transformer.of(config.model, config.data.vocab_size)
  params = train_state.create_train_state(model, optax.sgd(0.0), seed=0).params

  def loss_fn(params):
    logits = model.apply({'params': params}, batch['encoder_input_tokens'],
                         batch['decoder_input_tokens'], train=False)  # [B, T, V]
    sums = losses.weighted_sums(logits, batch['decoder_target_tokens'], batch['decoder_target_weights'])
    return sums['nll'] / sums['tokens'], logits

  (loss, logits), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
  return float(loss), float(optax.global_norm(grads)), np.asarray(logits, np.float32)


def main(argv):
  del argv
  # What the script prints is its output; library INFO records go only where --verbosity asks.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  config = command_line.config_from_flags()
  batch = padded_batch(config.data.vocab_size)
  real = batch['decoder_target_weights'] > 0
  runs = {}
  for dtype, impl in (('float32', 'xla'), ('bfloat16', 'xla'), ('bfloat16', FUSED_IMPL.value)):
    loss, grad_norm, logits = loss_grad_norm_logits(config, dtype, impl, batch)
    runs[dtype, impl] = logits[real]  # [real target tokens, V]
    print(f'{dtype:8s} {impl:5s}: loss {loss:.6f}, grad norm {grad_norm:.6f}')
  reference = runs['float32', 'xla']
  for dtype, impl in (('bfloat16', 'xla'), ('bfloat16', FUSED_IMPL.value)):
    difference = np.abs(runs[dtype, impl] - reference)
    print(f'{dtype} {impl} vs float32 xla: max |logit diff| over real tokens '
          f'{difference.max():.4f}, mean {difference.mean():.5f}')
  difference = np.abs(runs['bfloat16', FUSED_IMPL.value] - runs['bfloat16', 'xla'])
  print(f'bfloat16 {FUSED_IMPL.value} vs bfloat16 xla: max |logit diff| {difference.max():.4f}, '
        f'mean {difference.mean():.5f}')


if __name__ == '__main__':
  app.run(main, flags_parser=command_line.parse_flags)
