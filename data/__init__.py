"""Data layer: TFDS builders, the sentencepiece tokenizer and the grain input pipeline."""
