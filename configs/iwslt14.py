"""IWSLT14 De->En matching fairseq's `transformer_iwslt_de_en` recipe.

  python train.py --config=configs/iwslt14.py --workdir=runs/iwslt14

fairseq: 6+6 layers, d_model 512, FFN 1024, 4 heads, dropout 0.3, Adam (0.9, 0.98), lr 5e-4,
inverse-sqrt schedule with 4000 warmup steps, label smoothing 0.1, 4096 tokens per batch, shared
decoder input/output embedding. Preset 'en_de' flips the direction.
"""

from configs import base


def get_config(preset: str = 'de_en'):
  config = base.get_config()
  base.set_direction(config, preset, 'configs/iwslt14.py')
  config.data.update(dataset='iwslt14', dataset_config='tokenized', vocab_size=10000, max_length=128,
                     max_tokens=4096)
  config.model.update(d_model=512, num_heads=4, d_ff=1024, num_encoder_layers=6, num_decoder_layers=6,
                      dropout_rate=0.3, attention_dropout_rate=0.0, norm='layer', norm_position='post',
                      share_embeddings=True, tie_output_embedding=True)
  config.optim.update(optimizer='adam', learning_rate=5e-4, b1=0.9, b2=0.98, eps=1e-8,
                      schedule='inverse_sqrt', warmup_steps=4000, clip_norm=0.0)
  config.train.update(num_steps=60000, log_every=100, eval_every=2000, checkpoint_every=2000,
                      keep_checkpoints=10, label_smoothing=0.1)
  return config
