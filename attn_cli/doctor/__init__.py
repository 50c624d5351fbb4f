"""`attn doctor`: checks for the mistakes that make a Transformer fail silently, each a `Check` with
what was found and the fix (checks.py, which also shows them as a table or JSON). `diagnose.py` runs
them all: the environment and a training step's memory (environment.py), the config
(config_checks.py), the data, from one streamed pass over the corpus (data_checks.py), and, given a
checkpoint, the model itself on real sentences (probes.py): the masks, positions and the cached
decoder (model_checks.py), the score scale and how attention spreads, on attention calls captured
with forward hooks (attention_checks.py). The layer after `export`: it may import data, model,
decoding and training; nothing of the command line."""
