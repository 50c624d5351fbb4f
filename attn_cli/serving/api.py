"""attn's own API: POST /v1/translate with the decoding options `attn translate` takes, each
sentence as `attn translate --format jsonl` writes it (`Translation.to_dict`: its n-best list, scores,
confidence, terms and notes), and on request its word alignment and the three attentions; GET
/v1/models and GET /health.

The decoding fields are made from the one declaration of the options (attn_cli/decoding/options.py),
with the types of the config's `decode` section, so a field and its flag cannot drift apart.
"""

from __future__ import annotations

import typing
from typing import Literal, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, create_model

from attn_cli.config import DecodeConfig
from attn_cli.decoding.glossary import GlossaryError, glossary_from_json
from attn_cli.decoding.options import DECODE_OPTIONS
from attn_cli.decoding.records import Translation
from attn_cli.serving.errors import RequestError
from attn_cli.serving.request import TranslationRequest
from attn_cli.serving.server import SERVER_OPTIONS, Server
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


@router.post("/v1/translate", summary="Translate, with scores, n-best lists, alignment and attention")
async def translate(request: Request, body: TranslateRequest) -> dict:  # type: ignore[valid-type]
    try:
        glossary = glossary_from_json(body.glossary, "glossary") if body.glossary is not None else []
    except GlossaryError as error:
        raise RequestError(str(error)) from None
    translated = await _server(request).translate(
        TranslationRequest(
            texts_of(body.q)[0],
            body.format,
            body.model,
            body.source,
            body.target,
            {key: getattr(body, key) for key in DECODING_FIELDS},
            body.prefix,
            tuple(glossary),
            attention=body.attention or body.alignment,
            api_key=body.api_key or request.headers.get("x-api-key"),
        ),
        request,
    )
    texts = [
        {"translation": translated.rebuilt(index), "sentences": [_sentence(t, body) for t in sentences]}
        for index, sentences in enumerate(translated.sentences)
    ]
    return {"model": translated.model.name, "translations": texts}  # one per text of q


def _sentence(translation: Translation, body) -> dict:
    """A sentence's translation as the JSONL output has it, with its alignment and attention when asked."""
    from attn_cli.decoding.attention_view import attention_payload, word_alignment

    answer = translation.to_dict()
    if translation.attention is not None:  # None: not asked for, or an empty line
        maps, source_tokens, target_tokens = translation.attention
        if body.alignment:
            answer["alignment"] = [list(pair) for pair in word_alignment(maps)]
            answer["tokens"] = {"source": source_tokens, "target": target_tokens}  # what the pairs index
        if body.attention:
            answer["attention"] = attention_payload(maps, source_tokens, target_tokens, decimals=4)
    return answer


@router.get("/v1/models", summary="The served models")
async def models(request: Request) -> dict:
    return {"models": [model.describe() for model in _server(request).models]}


@router.get("/health", summary="Whether the server can take work (503 when not), and its queues")
async def health(request: Request) -> JSONResponse:
    server = _server(request)
    why = server.not_ready()
    answer = {
        "status": "ok" if why is None else "not ready",
        **({"reason": why} if why else {}),
        "api_key_required": server.api_keys is not None,
        "limits": {
            "max_sentences": server.limits.max_sentences,
            "max_attention_sentences": server.limits.max_attention_sentences,
        },
        "models": {
            name: {"queued_sentences": batcher.queued_sentences, **vars(batcher.stats)}
            for name, batcher in server.batchers.items()
        },
    }
    return JSONResponse(answer, status_code=200 if why is None else 503)
