"""The encoder-decoder: cached decoding, the component matrix, parameter counts, config checks."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import base
from model import admin, blocks, decoding, flops, losses, transformer
from model.config import ModelConfig
from model.transformer import Transformer

VOCAB = 37
SOURCE = jnp.array([[5, 6, 7, 8, 9, 1, 0], [10, 11, 12, 1, 0, 0, 0], [4, 5, 6, 7, 8, 9, 1]])
TARGET_IN = jnp.array([[2, 13, 14, 15, 16, 17], [2, 18, 19, 20, 0, 0], [2, 4, 4, 5, 5, 6]])
TARGET_OUT = jnp.array([[13, 14, 15, 16, 17, 1], [18, 19, 20, 1, 0, 0], [4, 4, 5, 5, 6, 1]])


def tiny_config(**overrides) -> ModelConfig:
  config = base.get_config().model
  config.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2, num_decoder_layers=2)
  config.update(overrides)
  return ModelConfig.from_config(config, source_vocab_size=VOCAB, target_vocab_size=VOCAB)


def init(model, train=False):
  return model.init(jax.random.PRNGKey(1), SOURCE, TARGET_IN, train=train)


def param_shapes(model):
  return jax.eval_shape(lambda: init(model))['params']


@pytest.mark.parametrize('position,norm,norm_position', [
    *itertools.product(['sinusoidal', 'learned', 'rope', 'alibi', 'none'], ['layer', 'batch'], ['post']),
    ('sinusoidal', 'layer', 'sandwich'), ('alibi', 'rms', 'deepnorm'), ('rope', 'layer', 'admin')])
def test_incremental_decoding_equals_full_forward(position, norm, norm_position):
  model = Transformer(tiny_config(position=position, norm=norm, norm_position=norm_position))
  variables = init(model)
  if norm == 'batch':  # non-trivial running statistics, as after training
    variables = dict(variables, batch_stats=jax.tree.map(
        lambda s: s + 0.3 * jax.random.uniform(jax.random.PRNGKey(2), s.shape), variables['batch_stats']))
  if norm_position == 'admin':  # skip weights other than 1
    variables = dict(variables, params=admin.profiled_params(model, variables, seed=0))
  full = model.apply(variables, SOURCE, TARGET_IN)  # [B, T, V]

  @jax.jit
  def incremental(variables):
    encoded = model.apply(variables, SOURCE, method=Transformer.encode)
    source_cache = model.apply(variables, encoded, SOURCE, method=Transformer.source_cache)
    cache = model.apply(variables, SOURCE.shape[0], 1, TARGET_IN.shape[1], method=Transformer.init_cache)
    steps = []
    for t in range(TARGET_IN.shape[1]):
      logits, cache = model.apply(variables, TARGET_IN[:, t], cache, t, source_cache,
                                  method=Transformer.decode_step)
      steps.append(logits)
    return jnp.stack(steps, axis=1)

  real = np.asarray(TARGET_IN != 0)
  scale = float(jnp.abs(full).max())
  np.testing.assert_allclose(np.asarray(incremental(variables))[real], np.asarray(full)[real],
                             atol=1e-5 * scale, rtol=1e-4)


def test_hypotheses_of_one_sentence_share_its_source_cache_row():
  # Rows b*K .. b*K+K-1 continue sentence b: fed different prefixes, each row's logits equal
  # those of its prefix decoded alone against a source batch of its own sentence.
  model = Transformer(tiny_config())
  variables = init(model)
  beams = 2
  encoded = model.apply(variables, SOURCE, method=Transformer.encode)
  source_cache = model.apply(variables, encoded, SOURCE, method=Transformer.source_cache)
  prefixes = np.stack([TARGET_IN, np.roll(TARGET_IN, 1, axis=0)], axis=1)  # [B, K, T]
  prefixes = prefixes.reshape(-1, TARGET_IN.shape[1])[:, :3]  # [B*K, 3]

  def run(rows, source_cache, cache):
    for t in range(rows.shape[1]):
      logits, cache = model.apply(variables, rows[:, t], cache, t, source_cache,
                                  method=Transformer.decode_step)
    return logits

  together = run(prefixes, source_cache,
                 model.apply(variables, SOURCE.shape[0], beams, 3, method=Transformer.init_cache))
  for row, prefix in enumerate(prefixes):
    sentence = jax.tree.map(lambda x: x[row // beams][None], source_cache)
    alone = run(prefix[None], sentence, model.apply(variables, 1, 1, 3, method=Transformer.init_cache))
    np.testing.assert_allclose(together[row], alone[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('position', ['sinusoidal', 'rope', 'alibi'])
def test_beam_search_over_the_shared_cache_equals_beam_search_over_full_passes(position):
  # The cache keeps every key where it was written and beam search reorders only each
  # hypothesis's history; a step function that recomputes each hypothesis's whole prefix from
  # scratch (its prefix reordered with it) must give the same hypotheses and scores, phases
  # that drop finished sentences included.
  model = Transformer(tiny_config(position=position))
  variables = init(model)
  # A spread-out output layer, so that no two candidates tie within float rounding.
  params = dict(variables['params'])
  params['source_embedding'] = {'embedding': 6.0 * params['source_embedding']['embedding']}
  variables = dict(variables, params=params)
  batch, beams, length = SOURCE.shape[0], 3, 6

  def no_pad(logits):  # a fed pad token would be masked in the full pass, not in the cache
    return logits.at[:, 0].set(-jnp.inf)

  def cached_step(tokens, cache, position_index, source_cache):
    logits, cache = model.apply(variables, tokens, cache, position_index, source_cache,
                                method=Transformer.decode_step)
    return no_pad(logits), cache

  def full_step(tokens, cache, position_index, source):
    prefix = cache['prefix'].at[:, position_index].set(tokens)  # [R, T]
    logits = model.apply(variables, jnp.repeat(source, len(tokens) // len(source), axis=0), prefix)
    return no_pad(logits[:, position_index]), {'prefix': prefix}

  search = lambda step, cache, context: decoding.beam_search(
      step, cache, batch_size=batch, beam_size=beams, max_length=length, context=context,
      length_penalty=1.0, smallest_batch=1)
  encoded = model.apply(variables, SOURCE, method=Transformer.encode)
  source_cache = model.apply(variables, encoded, SOURCE, method=Transformer.source_cache)
  cached = jax.jit(lambda: search(
      cached_step, model.apply(variables, batch, beams, length, method=Transformer.init_cache),
      source_cache))()
  full = jax.jit(lambda: search(
      full_step, {'prefix': jnp.zeros((batch * beams, length), jnp.int32)}, SOURCE))()
  np.testing.assert_array_equal(cached[0], full[0])
  np.testing.assert_allclose(cached[1], full[1], rtol=1e-5)
  assert np.isfinite(np.asarray(cached[1])).all()


def test_recorded_cross_attention_weights_are_distributions_over_the_real_source():
  model = Transformer(tiny_config())
  variables = init(model)
  plain = model.apply(variables, SOURCE, TARGET_IN)
  logits, state = model.apply(variables, SOURCE, TARGET_IN, mutable=['intermediates'])
  np.testing.assert_array_equal(logits, plain)  # recording changes nothing
  for i in range(2):
    (weights,) = state['intermediates'][f'decoder_layer_{i}']['cross_attention']['attention_weights']
    assert weights.shape == (3, 2, TARGET_IN.shape[1], SOURCE.shape[1])  # [B, N, T, S]
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    # Real target tokens put no weight on source padding (padding queries are masked whole).
    real_queries = np.asarray(TARGET_IN != 0)[:, None, :, None]  # [B, 1, T, 1]
    assert (np.asarray(weights) * real_queries * np.asarray(SOURCE == 0)[:, None, None, :] == 0).all()


def fairseq_transformer_parameter_count(src_vocab, tgt_vocab, d, ffn, enc_layers, dec_layers,
                                        normalize_before=False, share_decoder_input_output_embed=True):
  """fairseq TransformerModel's parameter count, from its architecture (fairseq/models/transformer).

  MultiheadAttention: q/k/v/out_proj Linear(d, d) with bias. Encoder layer: self_attn,
  self_attn_layer_norm, fc1 Linear(d, ffn), fc2 Linear(ffn, d), final_layer_norm. Decoder layer adds
  encoder_attn and encoder_attn_layer_norm. Sinusoidal positions have no parameters; the final
  stack LayerNorms exist only with normalize_before; the tied output projection adds nothing.
  """
  linear = lambda i, o: i * o + o
  attention = 4 * linear(d, d)
  layer_norm = 2 * d
  ffn_params = linear(d, ffn) + linear(ffn, d)
  encoder_layer = attention + ffn_params + 2 * layer_norm
  decoder_layer = 2 * attention + ffn_params + 3 * layer_norm
  total = src_vocab * d + tgt_vocab * d + enc_layers * encoder_layer + dec_layers * decoder_layer
  if normalize_before:
    total += 2 * layer_norm
  if not share_decoder_input_output_embed:
    total += tgt_vocab * d
  return total


@pytest.mark.parametrize('norm_position', ['post', 'pre'])
def test_iwslt_model_parameter_count_equals_fairseq(norm_position):
  config = base.get_config().model
  config.update(d_model=512, num_heads=4, d_ff=1024, num_encoder_layers=6, num_decoder_layers=6,
                share_embeddings=False, tie_output_embedding=True, norm_position=norm_position)
  model = Transformer(ModelConfig.from_config(config, source_vocab_size=8848, target_vocab_size=6632))
  shapes = param_shapes(model)
  ours = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes))
  assert ours == fairseq_transformer_parameter_count(8848, 6632, 512, 1024, 6, 6,
                                                     normalize_before=norm_position == 'pre')


def test_untied_output_projection_adds_a_vocabulary_matrix():
  tied = param_shapes(Transformer(tiny_config()))
  untied = param_shapes(Transformer(tiny_config(tie_output_embedding=False)))
  count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  assert count(untied) - count(tied) == 16 * VOCAB


def test_bfloat16_compute_keeps_float32_params_and_logits():
  model = Transformer(tiny_config(dtype='bfloat16'))
  variables = init(model)
  assert {leaf.dtype for leaf in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
  logits = model.apply(variables, SOURCE, TARGET_IN)
  assert logits.dtype == jnp.float32
  reference = Transformer(tiny_config()).apply(variables, SOURCE, TARGET_IN)
  np.testing.assert_allclose(logits, reference, atol=0.1 * float(jnp.abs(reference).max()))


def test_residual_off_changes_the_function():
  with_residual = Transformer(tiny_config())
  variables = init(with_residual)
  without = Transformer(tiny_config(residual=False)).apply(variables, SOURCE, TARGET_IN)
  assert not np.allclose(with_residual.apply(variables, SOURCE, TARGET_IN), without)


def test_deepnorm_constants_are_those_of_wang_et_al():
  # Table 1 of DeepNet, encoder-decoder with N encoder and M decoder layers.
  for n, m in ((6, 6), (12, 3), (24, 24)):
    assert blocks.deepnorm_alpha(n, m, decoder=False) == pytest.approx(0.81 * (n ** 4 * m) ** (1 / 16))
    assert blocks.deepnorm_beta(n, m, decoder=False) == pytest.approx(0.87 * (n ** 4 * m) ** (-1 / 16))
    assert blocks.deepnorm_alpha(n, m, decoder=True) == pytest.approx((3 * m) ** 0.25)
    assert blocks.deepnorm_beta(n, m, decoder=True) == pytest.approx((12 * m) ** -0.25)
  # 6+6: a = 0.81 * 6^(5/16) = 1.418 and b = 0.87 * 6^(-5/16) = 0.497 in the encoder.
  assert blocks.deepnorm_alpha(6, 6, False) == pytest.approx(1.4179, abs=1e-4)
  assert blocks.deepnorm_beta(6, 6, False) == pytest.approx(0.4970, abs=1e-4)


def test_deepnorm_scales_value_output_and_ffn_inits_by_beta_and_nothing_else():
  layers = dict(num_encoder_layers=3, num_decoder_layers=2)
  post = init(Transformer(tiny_config(norm_position='post', **layers)))['params']
  deep = init(Transformer(tiny_config(norm_position='deepnorm', **layers)))['params']
  beta = {False: blocks.deepnorm_beta(3, 2, False), True: blocks.deepnorm_beta(3, 2, True)}
  scaled = 0
  for path, value in jax.tree_util.tree_leaves_with_path(post):
    keys = [k.key for k in path]
    want = np.asarray(value)
    if keys[-1] == 'kernel' and (keys[-2] in ('value', 'out', 'w1', 'w2')):
      want = want * beta[keys[0].startswith('decoder')]
      scaled += 1
    got = deep
    for key in keys:
      got = got[key]
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg='/'.join(keys))
  # value and out of each attention, w1 and w2 of each FFN: 3 * (2 + 2) + 2 * (2 + 2 + 2).
  assert scaled == 24


@pytest.mark.parametrize('field,value,message', [
    ('norm', 'group', "config.model.norm='group' is not one of: batch, layer, rms, scale"),
    ('norm_position', 'rezero', "config.model.norm_position='rezero' is not one of: admin, deepnorm, post, pre, sandwich"),
    ('position', 'xpos', "config.model.position='xpos' is not one of: alibi, learned, none, rope, sinusoidal"),
    ('activation', 'tanh', "config.model.activation='tanh' is not one of: gelu, relu, swiglu"),
    ('attention_impl', 'flash', "config.model.attention_impl='flash' is not one of: cudnn, jax, xla"),
    ('dtype', 'float16', "config.model.dtype='float16' is not one of: bfloat16, float32"),
    ('num_heads', 3, 'config.model.d_model=16 must be divisible by config.model.num_heads=3'),
    ('dropout_rate', 1.5, 'config.model.dropout_rate=1.5 must be in [0, 1)'),
])
def test_invalid_model_config_names_the_field(field, value, message):
  with pytest.raises(ValueError) as error:
    tiny_config(**{field: value})
  assert str(error.value).startswith(message)


def test_unknown_model_key_and_vocab_mismatch_are_rejected():
  config = base.get_config().model
  config.d_modle = 3
  with pytest.raises(ValueError, match='unknown config.model keys: d_modle'):
    ModelConfig.from_config(config, source_vocab_size=10, target_vocab_size=10)
  with pytest.raises(ValueError, match='share_embeddings=True needs one joint vocabulary'):
    ModelConfig.from_config(base.get_config().model, source_vocab_size=10, target_vocab_size=12)


@pytest.mark.parametrize('smoothing', [0.0, 0.1, 0.3])
def test_label_smoothed_loss_equals_optax_one_hot_form(smoothing):
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 11)) * 3, jnp.float32)
  targets = jnp.array([[1, 2, 3], [4, 0, 0]])
  loss, nll = losses.token_losses(logits, targets, smoothing)
  labels = optax.smooth_labels(jax.nn.one_hot(targets, 11), smoothing)
  np.testing.assert_allclose(loss, optax.softmax_cross_entropy(logits, labels), rtol=1e-5)
  np.testing.assert_allclose(nll, optax.softmax_cross_entropy_with_integer_labels(logits, targets), rtol=1e-5)
  sums = losses.weighted_sums(logits, targets, targets != 0, smoothing)
  assert float(sums['tokens']) == 4
  np.testing.assert_allclose(sums['loss'], float((loss * (targets != 0)).sum()), rtol=1e-6)


@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_loss_gradient_equals_optax_one_hot_form(smoothing):
  """The one-hot product in token_losses has the same gradient as optax's cross entropy."""
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 11)) * 3, jnp.float32)
  targets = jnp.array([[1, 2, 3], [4, 5, 0]])
  ours = jax.grad(lambda z: losses.token_losses(z, targets, smoothing)[0].sum())(logits)
  labels = optax.smooth_labels(jax.nn.one_hot(targets, 11), smoothing)
  reference = jax.grad(lambda z: optax.softmax_cross_entropy(z, labels).sum())(logits)
  np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('tied', [True, False])
@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_output_layer_sums_equal_weighted_sums_of_the_logits(tied, smoothing):
  """The training loss read from the output layer's input (target and mean logits as [B, T, D]
  products) equals weighted_sums of the model's logits, in value and in gradient."""
  model = Transformer(tiny_config(tie_output_embedding=tied))
  params = init(model)['params']
  weights = (TARGET_OUT != 0).astype(jnp.float32)
  logits, hidden, table = model.apply({'params': params}, SOURCE, TARGET_IN, with_output_layer_input=True)
  np.testing.assert_array_equal(logits, model.apply({'params': params}, SOURCE, TARGET_IN))
  np.testing.assert_allclose(logits, np.einsum('btd,vd->btv', hidden, table), rtol=1e-5, atol=1e-5)

  def ours(params):
    outputs = model.apply({'params': params}, SOURCE, TARGET_IN, with_output_layer_input=True)
    sums = losses.output_layer_sums(*outputs, TARGET_OUT, weights, smoothing)
    return sums['loss'], sums

  def reference(params):
    sums = losses.weighted_sums(model.apply({'params': params}, SOURCE, TARGET_IN), TARGET_OUT,
                                weights, smoothing)
    return sums['loss'], sums

  (_, got), got_grads = jax.value_and_grad(ours, has_aux=True)(params)
  (_, want), want_grads = jax.value_and_grad(reference, has_aux=True)(params)
  for name in ('loss', 'nll', 'tokens'):
    np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6), got_grads, want_grads)


@pytest.mark.parametrize('tied', [True, False])
@pytest.mark.parametrize('chunk_tokens', [1, 4, 7, 64])
def test_chunked_output_layer_sums_equal_output_layer_sums(tied, chunk_tokens):
  """log Z over chunks of tokens (one per token, chunks that do not divide the 18 tokens, one chunk
  longer than all of them) gives output_layer_sums' sums and gradients."""
  model = Transformer(tiny_config(tie_output_embedding=tied))
  params = init(model)['params']
  weights = (TARGET_OUT != 0).astype(jnp.float32)

  def loss_of(sums_fn):
    def loss(params):
      logits, hidden, table = model.apply({'params': params}, SOURCE, TARGET_IN,
                                          with_output_layer_input=True)
      sums = sums_fn(logits, hidden, table)
      return sums['loss'], sums
    return jax.value_and_grad(loss, has_aux=True)(params)

  (_, got), got_grads = loss_of(lambda logits, hidden, table: losses.chunked_output_layer_sums(
      hidden, table, TARGET_OUT, weights, 0.1, chunk_tokens=chunk_tokens))
  (_, want), want_grads = loss_of(lambda *outputs: losses.output_layer_sums(
      *outputs, TARGET_OUT, weights, 0.1))
  for name in ('loss', 'nll', 'tokens'):
    np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6), got_grads, want_grads)


def test_chunked_output_layer_sums_reject_empty_chunks():
  with pytest.raises(ValueError, match='chunk_tokens=0 must be positive'):
    losses.chunked_output_layer_sums(jnp.zeros((1, 2, 4)), jnp.zeros((5, 4)),
                                     jnp.zeros((1, 2), jnp.int32), jnp.ones((1, 2)), chunk_tokens=0)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_tied_logits_gradient_equals_autodiff(dtype):
  """The hand-written VJP of the tied output projection equals autodiff of x @ E^T."""
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(2, 5, 8)), dtype)  # [B, T, D]
  embedding = jnp.asarray(rng.normal(size=(13, 8)), jnp.float32)  # [V, D]
  probe = jnp.asarray(rng.normal(size=(2, 5, 13)), jnp.float32)  # a fixed cotangent [B, T, V]
  reference_fn = lambda x, e: jnp.einsum('btd,vd->btv', x, e.astype(x.dtype),
                                         preferred_element_type=jnp.float32)
  ours = jax.grad(lambda x, e: (transformer.tied_logits(x, e) * probe).sum(), argnums=(0, 1))(x, embedding)
  reference = jax.grad(lambda x, e: (reference_fn(x, e) * probe).sum(), argnums=(0, 1))(x, embedding)
  np.testing.assert_allclose(transformer.tied_logits(x, embedding), reference_fn(x, embedding), rtol=1e-6)
  tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
  for got, want in zip(ours, reference):
    assert got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize('activation', ['relu', 'swiglu'])
def test_analytic_forward_flops_match_xla_cost_analysis(activation, monkeypatch):
  """model/flops.py counts what XLA counts for the forward pass's matmuls, within the ~2% that
  elementwise work (softmax, norms, activations) adds."""
  # XLA counts the fusion boundaries' divisions as several FLOPs each: left out, as no work.
  monkeypatch.setattr(blocks, 'fusion_boundary', lambda x: x)
  cfg = tiny_config(d_model=64, num_heads=4, d_ff=128, activation=activation, dropout_rate=0.0)
  model = Transformer(cfg)
  variables = init(model)
  batch, source_length, target_length = 8, 24, 20
  source = jnp.ones((batch, source_length), jnp.int32)
  target = jnp.ones((batch, target_length), jnp.int32)
  compiled = jax.jit(lambda v, s, t: model.apply(v, s, t)).lower(variables, source, target).compile()
  analysis = compiled.cost_analysis()
  xla_flops = (analysis[0] if isinstance(analysis, list) else analysis)['flops']
  analytic = flops.forward_flops(cfg, batch, source_length, target_length)
  assert analytic <= xla_flops <= 1.05 * analytic, (analytic, xla_flops)
