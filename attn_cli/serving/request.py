"""One translation request as the server takes it, whichever API it came through: each API (the
LibreTranslate one, attn's /v1) reads its own fields into a `TranslationRequest`, and the server
does the rest once (attn_cli/serving/server.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from attn_cli.decoding.glossary import Term


@dataclass(frozen=True)
class TranslationRequest:
    texts: list[str]  # the texts of `q`; one sentence a line (text), or an HTML document each
    format: str = "text"  # "text" or "html"
    model: Optional[str] = None  # a served model's name; or else chosen by its languages
    source: Optional[str] = None  # a language code, or "auto"
    target: Optional[str] = None
    options: Mapping[str, Any] = field(default_factory=dict)  # decode options by key; None = the model's value
    prefix: Union[str, list[str], None] = None  # one for every line, or one per line
    glossary: tuple[Term, ...] = ()  # terms every sentence must use where they apply
    attention: bool = False  # each sentence's attention maps (for attention or alignment)
    api_key: Optional[str] = None
