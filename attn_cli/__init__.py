"""attn: train and run Transformer translation models from one YAML config."""

__version__ = "0.1.0"
