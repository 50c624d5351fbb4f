"""Training: the loop (`trainer`) and the setup it starts from (`setup`), one update (`step`), the
loss, precision, checkpoints and averaging, resume reconciliation, distributed ranks, signals and
random states, and what is shown and logged (`progress`, `metrics_log`, `early_stopping`). May
import `attn_cli.model`, `attn_cli.data` and `attn_cli.decoding` (validation translates); nothing of
the command line."""
