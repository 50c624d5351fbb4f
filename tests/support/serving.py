"""What the serving tests share: sentences for the served checkpoint (tests/conftest.py's
`served_checkpoint`), an in-process server of it, and what attn translate gives with it."""

from __future__ import annotations

from pathlib import Path

SENTENCES = ["sentence number 3", "sentence number 17", "number 5", "sentence sentence 42 number"]


def server_of(checkpoint: Path, **limits):
    """A Server of the checkpoint (its workers not started: the app's lifespan or the test starts them)."""
    from attn_cli.engines.load import load_engine
    from attn_cli.serving.models import ServedModels
    from attn_cli.serving.server import Limits, Server

    api_keys = limits.pop("api_keys", None)
    return Server(ServedModels([load_engine([], [checkpoint], None, "cpu")]), Limits(**limits), api_keys)


def reference(server, sentences, prefixes=None, glossaries=None, **options):
    """What attn translate gives for `sentences` (with a prefix and a glossary each, when given) with
    the served model and these decoding options."""
    from attn_cli.decoding.options import override_decode
    from attn_cli.decoding.pipeline import translate
    from support.decoding import sources_of

    engine = next(iter(server.models)).engine
    return translate(
        engine, sources_of(sentences, prefixes, glossaries), override_decode(engine.config.decode, options)
    )
