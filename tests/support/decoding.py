"""An engine of random models and the sources it translates, for the tests of the translation path."""


def engine_of(models, tokenizers, max_source_tokens: int = 255, target_language: str = "zh", source_language="en"):
    """attn's own engine (a TorchEngine) of one model or a list of them (an ensemble) with these
    tokenizers: its inputs split beyond `max_source_tokens` tokens, its outputs in `target_language`."""
    from attn_cli.config import Config, CorpusConfig, DataConfig
    from attn_cli.engines.pytorch import TorchEngine

    models = models if isinstance(models, (list, tuple)) else [models]
    data = DataConfig(corpus=CorpusConfig(path="corpus.tsv"), src_lang=source_language, tgt_lang=target_language)
    engine = TorchEngine(models, tokenizers, [Config(data=data)] * len(models))
    engine.max_source_tokens = max_source_tokens
    return engine


def sources_of(sentences, prefixes=None, glossaries=None, attention: bool = False):
    """A `Source` of each sentence, with its prefix and glossary terms (one per sentence) when given."""
    from attn_cli.decoding.records import Source

    prefixes = prefixes if prefixes is not None else [""] * len(sentences)
    glossaries = glossaries if glossaries is not None else [()] * len(sentences)
    assert len(prefixes) == len(glossaries) == len(sentences), "one prefix and one glossary per sentence"
    return [Source(s, p, tuple(g), attention) for s, p, g in zip(sentences, prefixes, glossaries)]
