"""attn's own API: POST /v1/translate with the decoding options `attn translate` takes, each
sentence's n-best list, score and confidence, and on request its word alignment and the three
attentions; GET /v1/models and GET /health.

The decoding fields are made from the one declaration of the options (attn_cli/decoding/options.py),
with the types of the config's `decode` section, so a field and its flag cannot drift apart.

A sentence's confidence is the geometric mean of the probabilities the model gave the tokens it
chose (its end-of-sentence included, a forced prefix not): exp(log P / tokens), between 0 and 1,
comparable across lengths. A line split into parts counts all of its parts' tokens.
"""

from __future__ import annotations

import math
import typing
from typing import Literal, Optional, Union

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field, create_model

from attn_cli.config import DecodeConfig
from attn_cli.decoding.glossary import GlossaryError, glossary_from_json
from attn_cli.decoding.options import DECODE_OPTIONS
from attn_cli.decoding.translate import Translation
from attn_cli.serving.models import RequestError, ServedModel
from attn_cli.serving.server import SERVER_OPTIONS, Server, while_connected
from attn_cli.serving.texts import texts_of

DECODING_FIELDS = tuple(option.key for option in DECODE_OPTIONS if option.key not in SERVER_OPTIONS)


def _request_model():
    types = typing.get_type_hints(DecodeConfig)
    decoding = {
        option.key: (Optional[types[option.key]], Field(None, description=option.help.replace("--", "")))
        for option in DECODE_OPTIONS
        if option.key in DECODING_FIELDS
    }
    return create_model(
        "TranslateRequest",
        __config__=ConfigDict(extra="forbid"),
        q=(
            Union[str, list[str]],
            Field(..., description="Text to translate, or a list of texts; one sentence a line."),
        ),
        model=(Optional[str], Field(None, description="A served model's name (GET /v1/models), e.g. en-zh.")),
        source=(Optional[str], Field(None, description="Source language code, instead of `model`.")),
        target=(Optional[str], Field(None, description="Target language code, instead of `model`.")),
        format=(Literal["text", "html"], "text"),
        prefix=(
            Optional[Union[str, list[str]]],
            Field(None, description="Target text each translation begins with: one for all, or one per line."),
        ),
        glossary=(
            Optional[list[list[str]]],
            Field(
                None,
                description="Terms each translation must use where their source side occurs: "
                '[["source term", "target term", more targets as alternatives...], ...]; needs beam_size >= 2.',
            ),
        ),
        alignment=(bool, Field(False, description="Add each sentence's word alignment (from cross-attention).")),
        attention=(bool, Field(False, description="Add each sentence's encoder, decoder and cross-attention.")),
        api_key=(Optional[str], None),
        **decoding,
    )


TranslateRequest = _request_model()
router = APIRouter(tags=["attn"])


def _server(request: Request) -> Server:
    return request.app.state.server


def _model(server: Server, body) -> ServedModel:
    if body.model is not None:
        return server.models.named(body.model)
    if body.target is not None:
        return server.models.for_languages(body.source or "auto", body.target)
    if len(server.models.models) == 1:
        return next(iter(server.models))
    raise RequestError(f"model: several models are served ({', '.join(server.models.models)}); name one")


def confidence(translation: Translation, prefix_tokens: int) -> float:
    """exp(mean log-probability per chosen token) of the best translation: see the module's docstring."""
    best = [hypotheses[0] for hypotheses in translation.outputs if hypotheses]
    if not best:
        return 1.0  # an empty line: nothing was chosen
    tokens = sum(len(h.tokens) + 1 for h in best) - prefix_tokens
    return math.exp(sum(h.log_prob for h in best) / max(tokens, 1))


@router.post("/v1/translate", summary="Translate, with scores, n-best lists, alignment and attention")
async def translate(request: Request, body: TranslateRequest) -> dict:  # type: ignore[valid-type]
    server = _server(request)
    server.check_key(body.api_key or request.headers.get("x-api-key"))
    model = _model(server, body)
    texts, _ = texts_of(body.q)
    options = server.decode_options(model, {key: getattr(body, key) for key in DECODING_FIELDS})
    prefixes = None
    if body.prefix is not None:
        lines = sum(len(text.split("\n")) for text in texts) if body.format == "text" else None
        if isinstance(body.prefix, str) and lines is not None:
            prefixes = [body.prefix] * lines
        elif isinstance(body.prefix, list):
            prefixes = body.prefix
        else:
            raise RequestError("prefix: give prefixes for format text only")
    try:
        glossary = glossary_from_json(body.glossary, "glossary") if body.glossary is not None else []
    except GlossaryError as error:
        raise RequestError(str(error)) from None
    translated = await while_connected(
        request,
        server.translate(model, texts, body.format, options, prefixes, body.attention or body.alignment, glossary),
    )
    target = model.loaded.tokenizers.target
    answers = []
    for index, text in enumerate(texts):
        sentences = []
        for sentence in translated.sentences_of(index):
            prefix_tokens = len(target.encode([sentence.prefix])[0]) if sentence.prefix.strip() else 0
            sentences.append(_sentence(sentence, prefix_tokens))
        answers.append({"translation": translated.texts[index], "sentences": sentences})
    offset = 0
    for answer in answers:  # attention is per sentence of the whole request
        for sentence in answer["sentences"]:
            _add_attention(sentence, translated.result.attention, offset, body)
            offset += 1
    return {"model": model.name, "translations": answers}  # one per text of q


def _sentence(sentence: Translation, prefix_tokens: int) -> dict:
    return {
        "source": sentence.source,
        "translation": sentence.texts[0],
        "score": sentence.scores[0],
        "confidence": round(confidence(sentence, prefix_tokens), 6),
        "n_best": [{"translation": text, "score": score} for text, score in zip(sentence.texts, sentence.scores)],
        "note": sentence.note,
        **({"terms": sentence.terms, "unmet_terms": sentence.unmet_terms} if sentence.terms else {}),
    }


def _add_attention(sentence: dict, attention: list, index: int, body) -> None:
    from attn_cli.decoding.attention_view import attention_payload, word_alignment

    if not attention:
        return
    found = attention[index]
    if found is None:  # an empty line
        return
    maps, source_tokens, target_tokens = found
    if body.alignment:
        sentence["alignment"] = [list(pair) for pair in word_alignment(maps)]
        sentence["tokens"] = {"source": source_tokens, "target": target_tokens}  # what the pairs index
    if body.attention:
        sentence["attention"] = attention_payload(maps, source_tokens, target_tokens, decimals=4)


@router.get("/v1/models", summary="The served models")
async def models(request: Request) -> dict:
    return {"models": [model.describe() for model in _server(request).models]}


@router.get("/health", summary="Whether the server is up, and its queues")
async def health(request: Request) -> dict:
    server = _server(request)
    return {
        "status": "ok",
        "api_key_required": server.api_keys is not None,
        "models": {
            name: {"queued_sentences": batcher.queued_sentences, **vars(batcher.stats)}
            for name, batcher in server.batchers.items()
        },
    }
