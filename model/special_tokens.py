"""The vocabulary's special token ids, the one place they are defined.

The tokenizer trains sentencepiece with them (data/tokenizer.py), batches are built with them
(data/pipeline.py), and the model reads them: padding is masked out everywhere, decoding starts
from BOS and ends at EOS.
"""

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
UNK_ID = 3
