"""The serving core that both APIs share: the served models with a model worker each, the limits
every request is held to, the API keys, and one call from a `TranslationRequest` to translations.

`Server.translate` does, once for every API: the key check, the source language of `source: auto`
detected (serving/detection.py), the choice of model, the decoding
options (validated by the same rule as the config; what a request leaves out keeps the model's
value), the texts cut into sentences, the limits, what the engine refuses (in the request's field
names), the sentences encoded into parts, the queue, and the answer's texts rebuilt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from attn_cli import languages
from attn_cli.config import ConfigError, DecodeConfig
from attn_cli.decoding.engine import Wording, refusals
from attn_cli.decoding.options import field_names, override_decode
from attn_cli.decoding.parts import split_sources
from attn_cli.decoding.records import Source, Translation
from attn_cli.errors import UserError
from attn_cli.serving.batcher import Batcher, QueueFull
from attn_cli.serving.detection import Detected, LanguageDetector
from attn_cli.serving.errors import RequestError
from attn_cli.serving.models import ServedModel, ServedModels
from attn_cli.serving.request import TranslationRequest
from attn_cli.serving.texts import Text, prepare_texts

# What a request may not set: the token budget of a decoding batch is the server's to choose.
SERVER_OPTIONS = ("max_tokens",)

# A refusal (attn_cli/decoding/engine.py) in the words of a request's fields.
WORDING = Wording(
    names={
        "prefix": "prefix",
        "terms": "glossary",
        "sample": "sample",
        "attention": "attention",
        "no_stutter": "no_stutter",
        "target": "target",
    },
    fixes={
        "checkpoint": "serve a checkpoint (attn serve --run or --checkpoint) to use it",
        "one_checkpoint": "serve one checkpoint (attn serve --run or --checkpoint) to use it",
        "beam": "set beam_size to 2 or more and sample to false",
        "allow_stutter": "set no_stutter to false",
        "target": "name a served language pair (GET /languages, /v1/models)",
    },
)


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1_000_000
    max_sentences: int = 128  # per request: lines of text, or HTML text runs
    max_characters: int = 2000  # per sentence
    max_beam: int = 16  # beam_size and n_best
    max_output_tokens: int = 512  # max_len_b: the tokens an output may have beyond max_len_a x its source's
    max_output_factor: float = 4.0  # max_len_a
    max_terms: int = 256  # glossary terms per request
    max_prefix_characters: int = 500  # per prefix
    max_attention_sentences: int = 16  # per request asking for attention or alignment: each is layers x heads x T^2
    timeout: float = 30.0  # seconds a request may wait for its decoding to begin (one call, for /health)
    shutdown_grace: float = 10.0  # seconds SIGTERM leaves accepted requests before the process exits
    queue_sentences: int = 2048  # sentences waiting per model: more are answered 429
    queue_work: int = 120_000  # source tokens x beam waiting per model: more are answered 429
    max_wait: float = 0.005  # seconds the worker waits for more requests to decode together
    token_budget: int = 4000  # source tokens decoded together
    turn_work: int = 600  # source tokens x beam in one decoding call: a longer request goes in turns
    batching: bool = True  # False: one request per decoding call


@dataclass
class Translated:
    """A request's answer: the model, each text's sentences and their translations."""

    model: ServedModel
    texts: list[Text]
    sentences: list[list[Translation]]  # per text, its sentences' translations in order
    detected: Optional[list[Detected]] = None  # with source "auto": each text's likeliest language

    def rebuilt(self, index: int, rank: int = 0) -> str:
        """Text `index` rebuilt from the `rank`-th candidate of each of its sentences (lines joined,
        HTML put back)."""
        return self.texts[index].rebuild([t.candidates[rank].text for t in self.sentences[index]])

    def alternatives(self, index: int) -> list[str]:
        """Text `index` rebuilt from each rank of its sentences' n-best lists, best first."""
        ranks = min(len(t.candidates) for t in self.sentences[index])
        return [self.rebuilt(index, rank) for rank in range(ranks)]


class Server:
    def __init__(self, models: ServedModels, limits: Limits = Limits(), api_keys: Optional[frozenset[str]] = None):
        self.models, self.limits, self.api_keys = models, limits, api_keys
        self.detector = LanguageDetector([code for model in models for code in (model.source, model.target)])
        self.batchers = {
            worker: Batcher(
                engine,
                limits.queue_sentences,
                limits.max_wait,
                limits.token_budget,
                batching=limits.batching,
                work_capacity=limits.queue_work,
                turn_work=limits.turn_work,
            )
            for worker, engine in models.engines.items()
        }

    def start(self) -> None:
        for batcher in self.batchers.values():
            batcher.start()

    def stop(self, grace: Optional[float] = None) -> None:
        """End the model workers once they have answered every accepted request, or after `grace`
        seconds in all (None: no end): a decode still running then is abandoned with its daemon
        thread, so that a stuck worker cannot keep the process from exiting."""
        deadline = None if grace is None else time.monotonic() + grace
        for batcher in self.batchers.values():
            batcher.stop(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def not_ready(self) -> Optional[str]:
        """Why the server cannot take work now, None when it can: a model worker stuck in one
        decoding call past the request timeout, or a queue nine-tenths full."""
        for name, batcher in self.batchers.items():
            since = batcher.decoding_since
            if since is not None and time.monotonic() - since > self.limits.timeout:
                return f"the {name} worker has been in one decoding call for {time.monotonic() - since:.0f} s"
            if batcher.queued_sentences >= 0.9 * batcher.capacity:
                return f"the {name} queue is full ({batcher.queued_sentences} of {batcher.capacity} sentences)"
            if batcher.queued_work >= 0.9 * batcher.work_capacity:
                return f"the {name} queue is full ({batcher.queued_work:,} of {batcher.work_capacity:,} units of work)"
        return None

    def check_key(self, key: Any) -> None:
        if self.api_keys is None:
            return
        if not isinstance(key, str) or not key:
            raise RequestError("api_key: this server needs an API key; send it as api_key", 403)
        if key not in self.api_keys:
            raise RequestError("api_key: not a valid API key", 403)

    def decode_options(self, model: ServedModel, given: Mapping[str, Any]) -> DecodeConfig:
        """The model's decode settings with a request's options; RequestError names the field. A
        request that asks for an n-best list longer than the model's beam, without a beam of its own,
        gets a beam as wide as the list."""
        given = dict(given)
        defaults = model.engine.config.decode
        if given.get("n_best") is not None and given.get("beam_size") is None and not given.get("sample"):
            given["beam_size"] = max(defaults.beam_size, given["n_best"])
        try:
            options = override_decode(defaults, given)
        except ConfigError as error:
            raise RequestError(error.describe(field_names())) from None
        for key, most in (
            ("beam_size", self.limits.max_beam),
            ("n_best", self.limits.max_beam),
            ("max_len_b", self.limits.max_output_tokens),
            ("max_len_a", self.limits.max_output_factor),
        ):
            if getattr(options, key) > most:
                raise RequestError(f"{key}: {getattr(options, key):g} is more than this server's {most:g}")
        return options

    async def translate(self, request: TranslationRequest, connection: Any = None) -> Translated:
        """Translate a request with its model's worker, decoded together with other requests'. While
        it waits, `connection` (the HTTP request, if any) is watched: a client that goes away cancels
        its work."""
        self.check_key(request.api_key)
        texts = prepare_texts(request.texts, request.format, self.limits.max_characters, self.limits.max_sentences)
        detected = None
        if request.source == "auto":
            written = [" ".join(text.sentences) for text in texts]
            request = dataclasses.replace(request, source=self.detect(written)[0].language)
            detected = [self.detector.detect(text)[0] for text in written]
        model = self.models.choose(request.model, request.source, request.target)
        options = self.decode_options(model, request.options)
        sources = self._sources(request, texts, model.asks_target)
        if request.attention and len(sources) > self.limits.max_attention_sentences:
            raise RequestError(
                f"attention: {len(sources)} sentences, more than the {self.limits.max_attention_sentences} this "
                f"server gives attention for in one request; send fewer, or leave attention and alignment out"
            )
        refused = [refusal for refusal in refusals(model.engine.capabilities, options, sources) if not refusal.warning]
        if refused:
            raise RequestError(f"{refused[0].message(WORDING)} (the {model.name} model is served by {model.backend})")
        try:
            prepared = split_sources(model.engine, sources, options)
        except UserError as error:
            raise RequestError(f"prefix: {error}") from None
        work = self.batchers[model.worker].translate(prepared, options, self.limits.timeout)
        try:
            translations = await (work if connection is None else while_connected(connection, work))
        except QueueFull as error:
            raise RequestError(f"{error}; slow down and try again", 429) from None
        except asyncio.TimeoutError:
            raise RequestError(
                f"the translation did not begin within this server's {self.limits.timeout:g} s: it is busy; "
                f"try again later",
                503,
            ) from None
        except UserError as error:
            raise RequestError(str(error)) from None
        per_text, start = [], 0
        for text in texts:
            per_text.append(translations[start : start + len(text.sentences)])
            start += len(text.sentences)
        return Translated(model, texts, per_text, detected)

    def detect(self, texts: Sequence[str]) -> list[Detected]:
        """The served source languages, likeliest first for `texts` taken together; a RequestError
        (400) when the likeliest of the server's languages is not one it translates from."""
        sources = list(dict.fromkeys(model.source for model in self.models))
        ranked = self.detector.detect(" ".join(texts))
        same = languages.primary_subtag
        if ranked and same(ranked[0].language) not in {same(code) for code in sources}:
            found = ranked[0].language
            served = ", ".join(f"{languages.name(code)} ({code})" for code in sources)
            raise RequestError(
                f"source: the text is in {languages.name(found)} ({found}, confidence {ranked[0].confidence:.0f}), "
                f"and this server translates from {served}; send text in a served source language"
            )
        return [detected for detected in ranked if same(detected.language) in {same(code) for code in sources}]

    def _sources(self, request: TranslationRequest, texts: Sequence[Text], target: Optional[str]) -> list[Source]:
        """Every sentence of the request's texts, with its prefix, the glossary, the attention flag
        and the target language it asks for (a model of several directions)."""
        sentences = [sentence for text in texts for sentence in text.sentences]
        if len(request.glossary) > self.limits.max_terms:
            raise RequestError(
                f"glossary: {len(request.glossary)} terms, more than the {self.limits.max_terms} this server takes in "
                f"one request; send the terms each request needs"
            )
        prefixes = [""] * len(sentences)
        if isinstance(request.prefix, str):
            if request.format != "text":
                raise RequestError("prefix: give prefixes for format text only")
            prefixes = [request.prefix] * len(sentences)
        elif request.prefix is not None:
            if len(request.prefix) != len(sentences):
                raise RequestError(
                    f"prefix: {len(request.prefix)} prefixes for {len(sentences)} sentences; give one per line"
                )
            prefixes = list(request.prefix)
        longest = max(prefixes, key=len, default="")
        if len(longest) > self.limits.max_prefix_characters:
            raise RequestError(
                f"prefix: {len(longest)} characters, more than the {self.limits.max_prefix_characters} this server "
                f"takes; shorten it"
            )
        return [
            Source(sentence, prefix, request.glossary, request.attention, target)
            for sentence, prefix in zip(sentences, prefixes)
        ]


async def while_connected(connection, awaitable):
    """`awaitable`'s result, unless the client of `connection` goes away first: then the work is
    cancelled (a translation not yet started is dropped from its queue) and the answer is a 499
    nobody reads."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(_disconnected(connection))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the request itself is cancelled (shutdown's grace is over): so is its work
        work.cancel()
        raise
    finally:
        gone.cancel()
    if work.done():
        return work.result()
    work.cancel()
    await asyncio.wait({work})  # its job is marked cancelled before the worker can take it
    raise RequestError("the client went away before its translation was ready", 499)


async def _disconnected(connection) -> None:
    while (await connection.receive())["type"] != "http.disconnect":
        pass
