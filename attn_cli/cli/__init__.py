"""The `attn` command line: the Typer app and what each command calls. Parse, call, print; the
work itself lives in the packages below. May import everything."""
