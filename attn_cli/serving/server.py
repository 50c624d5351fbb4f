"""The serving core that both APIs share: the served models with a model worker each, the limits
every request is held to, the API keys, and one call from texts to translations.

A request's decoding options are the ones `attn translate` takes, by their decode keys
(attn_cli/decoding/options.py), validated by the same rule as the config; what a request leaves out
keeps the model's config value.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from attn_cli.config import ConfigError, DecodeConfig
from attn_cli.decoding.glossary import Term
from attn_cli.decoding.options import field_names, override_decode
from attn_cli.decoding.translate import places_terms
from attn_cli.errors import UserError
from attn_cli.serving.batcher import Batcher, JobResult, QueueFull
from attn_cli.serving.models import RequestError, ServedModel, ServedModels
from attn_cli.serving.texts import Text, prepare_texts

# What a request may not set: the token budget of a decoding batch is the server's to choose.
SERVER_OPTIONS = ("max_tokens",)


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1_000_000
    max_sentences: int = 128  # per request: lines of text, or HTML text runs
    max_characters: int = 2000  # per sentence
    max_beam: int = 16  # beam_size and n_best
    max_attention_sentences: int = 16  # per request asking for attention or alignment: each is layers x heads x T^2
    timeout: float = 30.0  # seconds a request may wait for its translation
    queue_sentences: int = 2048  # sentences waiting per model: more are answered 429
    max_wait: float = 0.005  # seconds the worker waits for more requests to decode together
    token_budget: int = 4000  # source tokens decoded together
    batching: bool = True  # False: one request per decoding call


@dataclass
class Translated:
    texts: list[str]  # each request text's translation, rebuilt (lines joined, HTML put back)
    prepared: list[Text]
    result: JobResult  # the sentences' translations, in order

    def sentences_of(self, index: int) -> list:
        """The translations of the sentences of request text `index`."""
        start = sum(len(text.sentences) for text in self.prepared[:index])
        return self.result.translations[start : start + len(self.prepared[index].sentences)]

    def alternatives(self, index: int) -> list[str]:
        """Request text `index` rebuilt from each rank of its sentences' n-best lists, best first."""
        sentences = self.sentences_of(index)
        ranks = min(len(t.texts) for t in sentences)
        return [self.prepared[index].rebuild([t.texts[rank] for t in sentences]) for rank in range(ranks)]


class Server:
    def __init__(self, models: ServedModels, limits: Limits = Limits(), api_keys: Optional[frozenset[str]] = None):
        self.models, self.limits, self.api_keys = models, limits, api_keys
        self.batchers = {
            model.name: Batcher(
                model, limits.queue_sentences, limits.max_wait, limits.token_budget, batching=limits.batching
            )
            for model in models
        }

    def start(self) -> None:
        for batcher in self.batchers.values():
            batcher.start()

    def stop(self) -> None:
        """Answer every accepted request, then end the model workers."""
        for batcher in self.batchers.values():
            batcher.stop()

    def check_key(self, key: Any) -> None:
        if self.api_keys is None:
            return
        if not isinstance(key, str) or not key:
            raise RequestError("api_key: this server needs an API key; send it as api_key", 403)
        if key not in self.api_keys:
            raise RequestError("api_key: not a valid API key", 403)

    def decode_options(self, model: ServedModel, given: Mapping[str, Any]) -> DecodeConfig:
        """The model's decode settings with a request's options; RequestError names the field."""
        try:
            options = override_decode(model.loaded.config.decode, given)
        except ConfigError as error:
            raise RequestError(error.describe(field_names())) from None
        for key in ("beam_size", "n_best"):
            if getattr(options, key) > self.limits.max_beam:
                raise RequestError(f"{key}: {getattr(options, key)} is more than this server's {self.limits.max_beam}")
        return options

    async def translate(
        self,
        model: ServedModel,
        texts: Sequence[str],
        text_format: str,
        options: DecodeConfig,
        prefixes: Optional[Sequence[str]] = None,
        attention: bool = False,
        glossary: Sequence[Term] = (),
    ) -> Translated:
        """Translate a request's texts with `model`'s worker, decoded together with other requests',
        each sentence with the terms of `glossary` that apply to it."""
        limits = self.limits
        prepared = prepare_texts(texts, text_format, limits.max_characters, limits.max_sentences)
        sentences = [sentence for text in prepared for sentence in text.sentences]
        if prefixes is not None and len(prefixes) != len(sentences):
            raise RequestError(f"prefix: {len(prefixes)} prefixes for {len(sentences)} sentences; give one per line")
        if attention and not model.has_attention:
            raise RequestError(
                f"attention: the {model.name} model is served by {model.backend}"
                f"{' as an ensemble' if model.loaded.is_ensemble else ''}, which gives no attention weights; "
                f"serve one checkpoint (--run or --checkpoint)"
            )
        if attention and len(sentences) > limits.max_attention_sentences:
            raise RequestError(
                f"attention: {len(sentences)} sentences, more than the {limits.max_attention_sentences} this server "
                f"gives attention for in one request; send fewer, or leave attention and alignment out"
            )
        if glossary:
            if model.loaded.exported is not None:
                raise RequestError(
                    f"glossary: the {model.name} model is served by {model.backend}, which has no constrained "
                    f"search; serve a checkpoint (--run or --checkpoint) to use a glossary"
                )
            if not places_terms(options):
                raise RequestError(
                    "glossary: terms are placed by beam search only; set beam_size to 2 or more and sample to false"
                )
        try:
            result = await self.batchers[model.name].translate(
                sentences, options, list(prefixes) if prefixes else None, attention, limits.timeout, glossary
            )
        except QueueFull as error:
            raise RequestError(f"{error}; slow down and try again", 429) from None
        except asyncio.TimeoutError:
            raise RequestError(f"the translation took longer than this server's {limits.timeout:g} s", 503) from None
        except UserError as error:
            raise RequestError(str(error)) from None
        answer = Translated([], prepared, result)
        answer.texts = [text.rebuild([t.texts[0] for t in answer.sentences_of(i)]) for i, text in enumerate(prepared)]
        return answer


async def while_connected(request, awaitable):
    """`awaitable`'s result, unless the client goes away first: then the work is cancelled (a
    translation not yet started is dropped from its queue) and the answer is a 499 nobody reads."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if work.done():
        return work.result()
    work.cancel()
    await asyncio.wait({work})  # its job is marked cancelled before the worker can take it
    raise RequestError("the client went away before its translation was ready", 499)


async def _disconnected(request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
