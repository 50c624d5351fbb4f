"""The special token ids that the tokenizer, the batcher, the model and the searches agree on.

Every SentencePiece model attn trains reserves them in this order (`data/tokenizer.py`).
"""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
