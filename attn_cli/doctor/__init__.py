"""`attn doctor`: checks for the mistakes that make a Transformer fail silently, each a `Check` with
what was found and the fix. `diagnose` runs them all: the environment, the config, a training
step's memory, the data, and, given a checkpoint, the model itself (masks, positions, the cached
decoder, the score scale, how attention spreads). The layer after `export`: it may import data,
model, decoding and training; nothing of the command line."""
