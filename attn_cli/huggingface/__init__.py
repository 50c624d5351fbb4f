"""Hugging Face Transformers: Marian models (OPUS-MT) imported as attn runs, attn models exported as Marian."""
