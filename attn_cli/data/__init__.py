"""Data: corpus readers and the train/valid/test split (`corpus`), the SentencePiece tokenizers
(`tokenizer`), tokenized examples and token-budget batches (`batching`), and the preparation a run
does before training (`prepare`). May import `attn_cli.config`, `paths`, `errors` and `vocab`;
nothing of the model, decoding or training."""
