"""The Transformer model: attention, the KV cache, and the encoder–decoder."""

from attn_cli.model.cache import KVCache
from attn_cli.model.inference import inference_context, with_inference_context
from attn_cli.model.linear import inference_weights
from attn_cli.model.transformer import Encoded, Transformer, build_model

__all__ = ["Encoded", "KVCache", "Transformer", "build_model", "inference_context", "inference_weights",
           "with_inference_context"]
