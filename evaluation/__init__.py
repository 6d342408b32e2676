"""Evaluating translations: decoding and scoring a split, validation during training, a finished
run opened for eval.py."""
