"""Base configuration: every field of every experiment, with its default.

Dataset configs (`configs/multi30k.py`, `configs/iwslt14.py`) and `configs/smoke.py`
start from `get_config()` here and override what differs. Field names are a public
interface: override flags (`--config.model.norm=rms`), sweep files and scripts use them.
"""

import ml_collections


# Presets of the dataset configs that choose the translation direction.
DIRECTIONS = {'de_en': ('de', 'en'), 'en_de': ('en', 'de')}


def set_direction(config: ml_collections.ConfigDict, preset: str, config_file: str) -> None:
  """Sets data.source_lang/target_lang from a direction preset such as 'de_en'."""
  if preset not in DIRECTIONS:
    raise ValueError(f'{config_file} preset {preset!r} is not one of: {", ".join(DIRECTIONS)}')
  config.data.source_lang, config.data.target_lang = DIRECTIONS[preset]


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()

  model = config.model = ml_collections.ConfigDict()
  # Width of the residual stream (embeddings, attention and FFN inputs/outputs).
  model.d_model = 256
  # Attention heads per attention layer; d_model must be divisible by it.
  model.num_heads = 4
  # Hidden width of the position-wise feed-forward network.
  model.d_ff = 1024
  # Encoder layers.
  model.num_encoder_layers = 3
  # Decoder layers.
  model.num_decoder_layers = 3
  # Dropout on the embeddings and on every sublayer output before the residual sum (model/dropout.py: the keep probability is rounded to a multiple of 2^-16).
  model.dropout_rate = 0.1
  # Dropout on attention probabilities.
  model.attention_dropout_rate = 0.0
  # Normalisation: 'layer', 'rms', 'batch' (padding-aware) or 'scale' (ScaleNorm).
  model.norm = 'layer'
  # Where norms sit around each sublayer: 'post' (Vaswani 2017), 'pre' (Xiong 2020), 'sandwich' (Ding 2021), 'deepnorm' (Wang 2022) or 'admin' (Liu 2020); model/blocks.py.
  model.norm_position = 'pre'
  # Epsilon added to the variance (or mean square) in every norm.
  model.norm_epsilon = 1e-5
  # Position information: 'sinusoidal', 'learned', 'rope' or 'alibi' (both self-attention only) or 'none'.
  model.position = 'sinusoidal'
  # Largest position a 'learned' table holds (also the sinusoidal table length).
  model.max_position = 1024
  # FFN nonlinearity: 'relu', 'gelu' or 'swiglu'.
  model.activation = 'relu'
  # Residual connections around every sublayer; False is the lectures' ablation.
  model.residual = True
  # One embedding table for source and target tokens (needs data.vocabulary='joint').
  model.share_embeddings = True
  # Decoder output projection reuses the decoder input embedding (transposed).
  model.tie_output_embedding = True
  # Attention kernel: 'xla' (portable einsums) or 'cudnn' (jax.nn.dot_product_attention, GPU).
  model.attention_impl = 'xla'
  # Compute dtype: 'float32' or 'bfloat16'; params, logits, softmax, norms, products' sums stay float32.
  model.dtype = 'float32'
  # Parameter initialiser of dense and attention projections: 'xavier_uniform' (fairseq) or 'lecun_normal'.
  model.kernel_init = 'xavier_uniform'

  data = config.data = ml_collections.ConfigDict()
  # Dataset name: 'multi30k' or 'iwslt14'.
  data.dataset = 'multi30k'
  # Builder config: for multi30k 'original' (cased text) or 'tokenized' (authors' lc.norm.tok text).
  data.dataset_config = 'original'
  # Language translated from.
  data.source_lang = 'de'
  # Language translated into.
  data.target_lang = 'en'
  # Folder with the dataset's raw files; '' reads $SEQ2SEQ_DATA_DIR/<dataset> or downloads.
  data.source_dir = ''
  # Where prepared TFDS datasets and tokenizers are cached; '' means ~/.cache/seq2seq_lab.
  data.cache_dir = ''
  # Sentencepiece vocabularies: 'joint' (one over both languages) or 'separate' (one per language; needs model.share_embeddings=False).
  data.vocabulary = 'joint'
  # Sentencepiece vocabulary size (of the joint one, or of each separate one).
  data.vocab_size = 8000
  # Sentencepiece model type: 'unigram' or 'bpe'.
  data.vocab_type = 'unigram'
  # Training pairs tokenized this many times with sampled segmentations (Kudo 2018's subword regularization; BPE-dropout for 'bpe'), the copies shuffled together as one training set; 0: the best segmentation once.
  data.subword_samples = 0
  # Sampling strength: unigram's smoothing alpha (lower: more varied segmentations) or BPE's dropout probability.
  data.subword_alpha = 0.1
  # Unigram samples among the n best segmentations (-1: all of them); BPE ignores it.
  data.subword_nbest = 64
  # Longest source or target sequence in tokens (EOS included); longer training pairs are dropped and counted.
  data.max_length = 128
  # Train only on pairs whose source has at most this many words (0: no limit); length-extrapolation studies.
  data.train_max_source_words = 0
  # Token budget per training batch (padded source or target tokens, the larger), like fairseq --max-tokens.
  data.max_tokens = 4096
  # Pack several pairs into training rows of this many tokens per side (0: one pair per row, bucketed).
  data.pack_length = 0
  # Split used for validation loss and BLEU during training.
  data.eval_split = 'validation'
  # Sentences per evaluation batch.
  data.eval_batch_size = 64
  # Evaluate during training on the first N sentences of eval_split only (0 = all of it).
  data.eval_examples = 0
  # Worker threads/processes of the grain pipeline (0 = in the main thread).
  data.num_workers = 0

  optim = config.optim = ml_collections.ConfigDict()
  # Optimizer: 'adam', 'adamw' or 'sgd' (with momentum b1).
  optim.optimizer = 'adam'
  # Peak learning rate (after warmup).
  optim.learning_rate = 1e-3
  # Adam beta1, and SGD momentum.
  optim.b1 = 0.9
  # Adam beta2.
  optim.b2 = 0.98
  # Adam epsilon.
  optim.eps = 1e-8
  # Decoupled weight decay (adamw only).
  optim.weight_decay = 0.0
  # Schedule: 'inverse_sqrt', 'cosine', 'linear', 'constant' or 'step'; all start with a linear warmup.
  optim.schedule = 'inverse_sqrt'
  # Linear warmup steps from 0 to the peak rate; 0 starts at the peak.
  optim.warmup_steps = 4000
  # inverse_sqrt's decay scale w in P * sqrt(w / (t - W + w)); 0: max(warmup_steps, 1), fairseq's.
  optim.inverse_sqrt_scale = 0
  # Epochs after which 'step' multiplies the rate by decay_factor.
  optim.decay_epochs = ()
  # Multiplier of the 'step' schedule at each decay epoch.
  optim.decay_factor = 0.1
  # Global gradient-norm clipping threshold; 0 disables clipping.
  optim.clip_norm = 0.0

  train = config.train = ml_collections.ConfigDict()
  # Training length in optimizer steps (used when num_epochs is 0).
  train.num_steps = 10000
  # Training length in epochs over the training split; overrides num_steps when > 0.
  train.num_epochs = 0
  # Wall-clock minutes the whole run may take (0: no limit): at the end of warmup the run plans the
  # most steps, up to num_steps / num_epochs, that end within them, and again at every later
  # validation (training/time_budget.py).
  train.time_budget_minutes = 0.0
  # Seed of parameter init, data order and dropout.
  train.seed = 0
  # Steps between metric records.
  train.log_every = 50
  # Steps between validation evaluations (and at the end).
  train.eval_every = 1000
  # Steps between checkpoints (and at the end).
  train.checkpoint_every = 1000
  # Most recent checkpoints kept (the best by validation loss is kept as well).
  train.keep_checkpoints = 5
  # Label smoothing of the cross entropy (0 disables).
  train.label_smoothing = 0.1
  # Padded tokens per slice a step's forward and backward pass is computed in (0: the whole batch;
  # None: 512 on a CPU in float32 and 1,024 in bfloat16, whose cache they then fit, and 0 on
  # accelerators or with BatchNorm).
  train.microbatch_tokens = ml_collections.config_dict.placeholder(int)
  # Tokens per chunk of the loss's normaliser, so the [B, T, V] logits are never whole (0: whole).
  train.loss_chunk_tokens = 0
  # Optimizer steps per dispatch: a lax.scan over this many consecutive batches of one shape (fewer host round trips on an accelerator); results equal one step per dispatch.
  train.steps_per_call = 1
  # On SIGTERM/SIGINT, save a checkpoint if at least this many steps ran since the last one (0: never).
  train.save_on_stop_after = 1
  # Diverged when a logged window's mean training loss exceeds this (0 disables); NaN/inf always stop.
  train.divergence_loss_ceiling = 100.0
  # Diverged when a logged window's mean training loss exceeds this multiple of the lowest one (0 disables).
  train.divergence_growth = 5.0
  # Steps traced with jax.profiler into the run's profile/ folder after its first record (0: none).
  train.profile_steps = 0

  evaluation = config.eval = ml_collections.ConfigDict()
  # Beam width of eval.py decoding (1 is greedy).
  evaluation.beam_size = 5
  # Length penalty alpha; fairseq form score / length**alpha.
  evaluation.length_penalty = 1.0

  return config
