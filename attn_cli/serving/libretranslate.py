"""The LibreTranslate API, so that its clients (browser extensions, chat and forum software,
localisation tools, `libretranslatepy`) work unchanged: POST /translate, GET /languages,
POST /detect and GET /frontend/settings, with JSON or form fields, answers in its shapes and errors
as {"error": "..."}.

/detect and `source: auto` detect the text's language among the languages the served models read
and write (serving/detection.py): a text in a language no served model translates from is a 400
that names the served sources.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from attn_cli.languages import name as language_name
from attn_cli.serving.errors import RequestError, json_kind
from attn_cli.serving.request import TranslationRequest
from attn_cli.serving.server import Server
from attn_cli.serving.texts import texts_of

router = APIRouter(tags=["LibreTranslate"])


async def request_fields(request: Request) -> dict[str, Any]:
    """A request's fields from its JSON object, form or query string; RequestError for a body that
    is not valid UTF-8, not JSON, or not an object."""
    body = await request.body()
    fields: dict[str, Any] = dict(request.query_params)
    if not body:
        return fields
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(f"the body is not valid UTF-8 (byte {error.start}); send UTF-8") from None
    if content_type == "application/x-www-form-urlencoded":
        try:
            fields.update(parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict"))
        except UnicodeDecodeError:
            raise RequestError("a form field is not valid UTF-8 once percent-decoded; send UTF-8") from None
        return fields
    if content_type == "multipart/form-data":
        form = await request.form()
        fields.update({key: value for key, value in form.items() if isinstance(value, str)})
        return fields
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(f"the body is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}")
    except RecursionError:
        raise RequestError("the body nests arrays or objects too deep to read; send a flat object of fields") from None
    if not isinstance(parsed, dict):
        raise RequestError(f"the body must be a JSON object of fields, not {json_kind(parsed)}")
    fields.update(parsed)
    return fields


def _server(request: Request) -> Server:
    return request.app.state.server


def _string(fields: dict, key: str, default: str | None = None) -> str:
    value = fields.get(key, default)
    if not isinstance(value, str) or not value:
        raise RequestError(f"{key}: missing; give a language code (see GET /languages)")
    return value


def _count(fields: dict, key: str) -> int:
    value = fields.get(key, 0)
    try:
        count = int(value) if not isinstance(value, bool) else -1
    except (TypeError, ValueError):
        count = -1
    if count < 0:
        raise RequestError(f"{key}: {value!r} is not a whole number >= 0")
    return count


@router.post("/translate", summary="Translate text (LibreTranslate)")
async def translate(request: Request) -> JSONResponse:
    """Fields: q (a string or a list), source (a code or "auto"), target, format ("text" or
    "html"), alternatives (how many other translations to add), api_key."""
    fields = await request_fields(request)
    texts, is_list = texts_of(fields.get("q"))
    source = _string(fields, "source", "auto")
    alternatives = _count(fields, "alternatives")
    most = _server(request).limits.max_beam - 1  # the n-best list is the beam's: the best and the others
    if alternatives > most:
        raise RequestError(f"alternatives: {alternatives} is more than this server's {most}; ask for fewer")
    translated = await _server(request).translate(
        TranslationRequest(
            texts,
            str(fields.get("format", "text")),
            source=source,
            target=_string(fields, "target"),
            options={"n_best": alternatives + 1} if alternatives else {},
            api_key=fields.get("api_key"),
        ),
        request,
    )
    rebuilt = [translated.rebuilt(index) for index in range(len(texts))]
    answer: dict[str, Any] = {"translatedText": rebuilt if is_list else rebuilt[0]}
    if alternatives:
        others = [translated.alternatives(index)[1:] for index in range(len(texts))]
        answer["alternatives"] = others if is_list else others[0]
    if translated.detected is not None:
        detected = [found.to_dict() for found in translated.detected]
        answer["detectedLanguage"] = detected if is_list else detected[0]
    return JSONResponse(answer)


@router.get("/languages", summary="The languages served (LibreTranslate)")
async def languages(request: Request) -> JSONResponse:
    return JSONResponse(_server(request).models.languages())


@router.get("/frontend/settings", summary="What a LibreTranslate web front end asks of a server (LibreTranslate)")
async def frontend_settings(request: Request) -> JSONResponse:
    """The settings LibreTranslate's web front ends read before they translate: the character limit
    (a sentence's: longer lines are refused), whether keys are needed, and a first language pair."""
    server = _server(request)
    first = next(iter(server.models))
    keys = server.api_keys is not None
    return JSONResponse(
        {
            "charLimit": server.limits.max_characters,
            "frontendTimeout": 500,  # milliseconds a front end waits after typing before it translates
            "apiKeys": keys,
            "keyRequired": keys,
            "suggestions": False,
            "filesTranslation": False,
            "supportedFilesFormat": [],
            "language": {
                "source": {"code": first.source, "name": language_name(first.source)},
                "target": {"code": first.target, "name": language_name(first.target)},
            },
        }
    )


@router.post("/detect", summary="The served source language of a text (LibreTranslate)")
async def detect(request: Request) -> JSONResponse:
    server = _server(request)
    fields = await request_fields(request)
    server.check_key(fields.get("api_key"))
    texts, _ = texts_of(fields.get("q"))
    return JSONResponse([found.to_dict() for found in server.detect(texts)])
