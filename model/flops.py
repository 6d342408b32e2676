"""Analytic matmul FLOPs of the Transformer, for model FLOPs utilisation (MFU).

Counts 2 FLOPs per multiply-add of every matrix product the model computes: projections, the
feed-forward, attention scores and weighted sums (full S x S and T x T products, since that is
what the kernels compute; the causal half is not subtracted) and the output projection. Norms,
softmax, embeddings lookups and the optimizer are left out, as in the usual MFU convention
(Chowdhery et al. 2022, appendix B). A training step costs 3x the forward pass (forward, and the
two products of the backward pass). Tests check the forward count against XLA's cost analysis.

Dimensions: B batch, S source length, T target length, D model width, F FFN width, V vocabulary.
"""

from model.config import ModelConfig


def _ffn_macs_per_token(cfg: ModelConfig) -> int:
  matrices = 3 if cfg.activation == 'swiglu' else 2
  return matrices * cfg.d_model * cfg.d_ff


def forward_flops(cfg: ModelConfig, batch_size: int, source_length: int, target_length: int) -> int:
  """FLOPs of one teacher-forced forward pass over a [B, S] source and a [B, T] target."""
  d, s, t = cfg.d_model, source_length, target_length
  encoder_layer = s * (4 * d * d + _ffn_macs_per_token(cfg)) + 2 * s * s * d
  decoder_layer = (t * (4 * d * d + 2 * d * d + _ffn_macs_per_token(cfg))  # self Q,K,V,O; cross Q,O; FFN
                   + s * 2 * d * d  # cross-attention keys and values of the source
                   + 2 * t * t * d + 2 * t * s * d)  # self and cross scores and weighted sums
  output = t * d * cfg.target_vocab_size
  macs = (cfg.num_encoder_layers * encoder_layer + cfg.num_decoder_layers * decoder_layer + output)
  return 2 * batch_size * macs


def train_step_flops(cfg: ModelConfig, batch_size: int, source_length: int, target_length: int) -> int:
  return 3 * forward_flops(cfg, batch_size, source_length, target_length)
