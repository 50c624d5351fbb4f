"""The engines that translate (the protocol is attn_cli/decoding/engine.py): `pytorch`, attn's own
searches over one checkpoint or an ensemble, and `ctranslate2`, a model `attn export` wrote, with
the layout of its directory. `load` picks one from what the command line names. Only the engine
in use is imported: decoding with an export never imports torch."""
