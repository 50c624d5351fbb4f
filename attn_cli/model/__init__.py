"""The Transformer in plain PyTorch: attention (`attention`), the KV cache (`cache`) and the
encoder-decoder (`transformer`). Imports nothing of attn but the special ids (`attn_cli.vocab`) and,
in `build_model` alone, the model config."""

from attn_cli.model.cache import KVCache
from attn_cli.model.transformer import Encoded, Transformer, build_model

__all__ = ["Encoded", "KVCache", "Transformer", "build_model"]
