"""HTML in, HTML out: the text between tags is translated, every tag and attribute stays as it was.

`parse_html` cuts a document into its markup (tags, comments, declarations, and the whole of every
`<script>`, `<style>` and `<code>` element, which are never translated) and its text runs. Each run
is translated without its surrounding whitespace, which is put back (a run of only punctuation
stays as it is), and with its character
references read (`&amp;` is "&") and written again (`&` is `&amp;`). A run is translated on its own,
so words that a tag cuts apart ("an <b>important</b> word") are translated as separate pieces.

Broken markup is refused with where it is (line and column): a tag or comment that never closes, or
a script, style or code element without its end tag, for the text after it cannot be told from
markup. An end tag that closes nothing is kept as it is and ignored, as browsers and LibreTranslate
do, and end tags that HTML lets one leave out (`<p>`, `<li>`, ...) may be left out.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

# Elements whose content is kept as it is, markup and text alike.
UNTRANSLATED = ("script", "style", "code")
# Elements with no end tag.
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())

_ATTRIBUTE = r"""(?:\s+[^\s"'>/=]+(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'=<>`]+))?)"""
_TAG = re.compile(rf"<(/?)([A-Za-z][A-Za-z0-9:-]*)({_ATTRIBUTE}*)\s*(/?)>", re.DOTALL)
_DECLARATION = re.compile(r"<![^>-][^>]*>|<\?[^>]*>", re.DOTALL)  # <!DOCTYPE html>, <?xml ...?>


class HtmlError(ValueError):
    pass


@dataclass
class HtmlDocument:
    pieces: list[str]  # markup and text, in order
    text_at: list[int]  # which pieces are text to translate

    @property
    def texts(self) -> list[str]:
        """The text runs to translate: character references read, whitespace runs as one space (as a
        browser shows them)."""
        return [" ".join(html.unescape(self.pieces[i]).split()) for i in self.text_at]

    def rebuild(self, translations: Sequence[str]) -> str:
        """The document with each text run replaced by its translation, its whitespace kept."""
        if len(translations) != len(self.text_at):
            raise ValueError(f"{len(translations)} translations for {len(self.text_at)} text runs")
        pieces = list(self.pieces)
        for index, translation in zip(self.text_at, translations):
            run = pieces[index]
            leading, trailing = run[: len(run) - len(run.lstrip())], run[len(run.rstrip()) :]
            pieces[index] = leading + html.escape(translation, quote=False) + trailing
        return "".join(pieces)


def _where(document: str, offset: int) -> str:
    line = document.count("\n", 0, offset) + 1
    column = offset - (document.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


def parse_html(document: str) -> HtmlDocument:
    pieces: list[str] = []
    text_at: list[int] = []
    open_elements: list[str] = []
    position, text_start = 0, 0

    def end_text(at: int) -> None:
        if at > text_start:
            run = document[text_start:at]
            if any(character.isalnum() for character in run):  # punctuation alone stays as it is
                text_at.append(len(pieces))
            pieces.append(run)

    while True:
        position = document.find("<", position)
        if position < 0:
            break
        end = _markup_end(document, position)
        if end is None:  # a "<" that begins no markup ("a < b") is text
            position += 1
            continue
        end_text(position)
        tag = _TAG.match(document, position)
        if tag is not None and not tag.group(1) and tag.group(2).lower() in UNTRANSLATED:
            end = _end_of_element(document, tag)
        elif tag is not None:
            _track(document, tag, open_elements)
        pieces.append(document[position:end])
        position = text_start = end
    end_text(len(document))
    return HtmlDocument(pieces, text_at)


def _markup_end(document: str, start: int) -> int | None:
    """Where the markup beginning at `start` ends; None when "<" begins none; HtmlError when it
    begins markup that never closes."""
    following = document[start + 1 : start + 2]
    if document.startswith("<!--", start):
        end = document.find("-->", start + 4)
        if end < 0:
            raise HtmlError(f"html: the comment at {_where(document, start)} never ends; close it with -->")
        return end + 3
    if following == "!" or following == "?":
        declaration = _DECLARATION.match(document, start)
        if declaration is None:
            raise HtmlError(f"html: the declaration at {_where(document, start)} never ends; close it with >")
        return declaration.end()
    if not (following.isascii() and following.isalpha()) and not (
        following == "/" and document[start + 2 : start + 3].isalpha()
    ):
        return None
    tag = _TAG.match(document, start)
    if tag is None:
        raise HtmlError(f"html: the tag at {_where(document, start)} is not closed; end it with >")
    return tag.end()


def _end_of_element(document: str, tag: re.Match) -> int:
    """The end of a script, style or code element begun by `tag`, its content kept whole."""
    name = tag.group(2).lower()
    if tag.group(4):  # <code/>: no content
        return tag.end()
    closing = re.compile(rf"</{name}\s*>", re.IGNORECASE).search(document, tag.end())
    if closing is None:
        raise HtmlError(f"html: the <{name}> at {_where(document, tag.start())} has no </{name}>; close it")
    return closing.end()


def _track(document: str, tag: re.Match, open_elements: list[str]) -> None:
    """Follow which elements are open; an end tag closes the latest open element of its name (and
    those opened after it, as HTML's optional end tags allow), or nothing when none is open."""
    closing, name, self_closing = tag.group(1), tag.group(2).lower(), tag.group(4)
    if not closing:
        if name not in VOID and not self_closing:
            open_elements.append(name)
        return
    if name in VOID:
        return
    if name not in open_elements:
        return  # a stray end tag: kept as markup, as a browser would ignore it
    del open_elements[len(open_elements) - 1 - open_elements[::-1].index(name) :]
