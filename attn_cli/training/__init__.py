"""Training: the setup a run starts from (`setup`), the loop (`trainer`), one update (`step`), the
loss (`loss`), precision (`precision`), the run's state and where it starts from (`state`: resume,
fine-tuning, the rule for "best"), distributed ranks (`distributed`), a step's memory (`memory`),
what keeps the run's files sound (`guards`: the run lock, signals) and what is shown and logged
(`progress`). May import `attn_cli.model`, `attn_cli.data`, `attn_cli.checkpoint` and
`attn_cli.decoding` (validation translates); nothing of the command line, and nothing of inference
imports it."""
