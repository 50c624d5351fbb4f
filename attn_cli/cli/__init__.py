"""The `attn` command line: the Typer app (`app`) and one module per command (`train`, `tokenizer`,
`translate`, `eval`, `average`, ...), with what they share in `common` (options, the error handler)
and `decoding_flags` (the flags of the commands that decode, and the engine's refusals in their
words). Parse, call, print; the work itself lives in the packages below. May import everything."""

from attn_cli.cli.app import app, main

__all__ = ["app", "main"]
