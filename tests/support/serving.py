"""What the serving tests share: sentences for the served checkpoint (conftest.py's
`served_checkpoint`), an in-process server of it, and what attn translate gives with it."""

from __future__ import annotations

from pathlib import Path

SENTENCES = ["sentence number 3", "sentence number 17", "number 5", "sentence sentence 42 number"]


def server_of(checkpoint: Path, **limits):
    """A Server of the checkpoint (its workers not started: the app's lifespan or the test starts them)."""
    from attn_cli.serving.models import ServedModels
    from attn_cli.serving.server import Limits, Server
    from attn_cli.translator import load_for_decoding

    api_keys = limits.pop("api_keys", None)
    return Server(ServedModels([load_for_decoding([], [checkpoint], None, "cpu")]), Limits(**limits), api_keys)


def reference(server, sentences, **options):
    """What attn translate gives for `sentences` with the served model and these decoding options."""
    from attn_cli.decoding.options import override_decode
    from attn_cli.translator import translate

    loaded = next(iter(server.models)).loaded
    return translate(loaded, sentences, override_decode(loaded.config.decode, options))
