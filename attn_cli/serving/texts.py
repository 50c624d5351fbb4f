"""What a request's text becomes: the sentences a model decodes, and the answer rebuilt from them.

Plain text is translated line by line (a line is what attn translates as one input; a line longer
than the model takes is split by attn's long-input rule), and the lines are joined again with the
same newlines. HTML is cut into its text runs (serving/html.py). Every text is checked first: a
string, valid Unicode, no control characters but tab and newline, not empty, within the server's
limits of characters per sentence and sentences per request. Each problem is a RequestError that
names the field (`q[2]`) and says how to fix it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from attn_cli.serving.errors import RequestError, json_kind
from attn_cli.serving.html import HtmlDocument, HtmlError, parse_html

FORMATS = ("text", "html")
_ALLOWED_CONTROLS = frozenset("\t\n\r")


def texts_of(q: Any, field: str = "q") -> tuple[list[str], bool]:
    """The texts of a request's `q` (a string or a list of strings) and whether it was a list."""
    if isinstance(q, str):
        return [q], False
    if isinstance(q, list) and q and all(isinstance(item, str) for item in q):
        return list(q), True
    if isinstance(q, list) and not q:
        raise RequestError(f"{field}: an empty list; give at least one text to translate")
    if q is None:
        raise RequestError(f"{field}: missing; give the text to translate")
    if isinstance(q, list):
        number, item = next((n, item) for n, item in enumerate(q, start=1) if not isinstance(item, str))
        raise RequestError(f"{field}: item {number} is {json_kind(item)}; give a string for each text")
    raise RequestError(f"{field}: expected a string or a list of strings, got {json_kind(q)}")


def check_text(text: str, field: str, max_characters: int) -> None:
    if not text.strip():
        raise RequestError(f"{field}: empty text; give text to translate")
    for offset, character in enumerate(text):
        if 0xD800 <= ord(character) <= 0xDFFF:
            raise RequestError(f"{field}: not valid Unicode (a lone surrogate at character {offset}); send UTF-8 text")
        if character not in _ALLOWED_CONTROLS and unicodedata.category(character) == "Cc":
            raise RequestError(f"{field}: control character U+{ord(character):04X} at character {offset}; remove it")
    for number, line in enumerate(text.split("\n"), start=1):
        if len(line) > max_characters:
            raise RequestError(
                f"{field}: line {number} is {len(line)} characters, more than the {max_characters} this "
                f"server takes in one sentence; split it"
            )


@dataclass
class Text:
    """One text of a request as sentences to decode, and how to put their translations back."""

    sentences: list[str]
    html: Optional[HtmlDocument] = None  # None: plain text, one sentence per line

    def rebuild(self, translations: Sequence[str]) -> str:
        if self.html is not None:
            return self.html.rebuild(translations)
        return "\n".join(translations)


def prepare_texts(texts: Sequence[str], text_format: str, max_characters: int, max_sentences: int) -> list[Text]:
    """Each checked text cut into its sentences; RequestError for a bad text or too many sentences."""
    if text_format not in FORMATS:
        raise RequestError(f"format: {text_format!r} is not one of {', '.join(FORMATS)}")
    prepared = []
    for index, text in enumerate(texts):
        field = f"q[{index}]" if len(texts) > 1 else "q"
        check_text(text, field, max_characters)
        if text_format == "html":
            try:
                document = parse_html(text)
            except HtmlError as error:
                raise RequestError(f"{field}: {error}") from None
            prepared.append(Text(document.texts, document))
        else:
            prepared.append(Text([line.rstrip("\r") for line in text.split("\n")]))
    count = sum(len(text.sentences) for text in prepared)
    if count > max_sentences:
        raise RequestError(
            f"q: {count} sentences (lines or HTML text runs), more than the {max_sentences} this server takes "
            f"in one request; send them in several requests"
        )
    return prepared
