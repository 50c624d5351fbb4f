"""What attn needs to know of a language, from its code: one rule for each fact.

A code is read by its primary subtag, case aside: `zh`, `ZH`, `zh-CN`, `zh_Hans` and `zh-Hant-TW`
are all Chinese. Languages written without spaces between words (and sentences) join the parts of a
split input, and the sentences of a joined training pair, with nothing between them; the others
with a space. A long sentence is cut into clauses at punctuation and at coordinating
conjunctions. BLEU tokenizes each language as sacreBLEU recommends: by character for Chinese, with
MeCab for Japanese and Korean, with its 13a tokenizer otherwise. An English name labels the
languages of an exported Argos Translate package.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

# ISO 639-1 codes of the languages written without spaces: Chinese, Japanese, Thai, Lao, Khmer,
# Burmese, Tibetan.
UNSPACED = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo"})
_BLEU_TOKENIZERS = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}


class Direction(NamedTuple):
    """One way a model translates: from the source language into the target language."""

    source: str
    target: str

    def __str__(self) -> str:
        return f"{self.source}-{self.target}"  # en-zh: how files and logs name it

    @property
    def reversed(self) -> "Direction":
        return Direction(self.target, self.source)


def target_tag(code: str) -> str:
    """The piece put before a source to ask a multi-target model for language `code`: the >>xx<<
    convention of OPUS-MT and fairseq's multilingual models."""
    return f">>{code}<<"


def unwritten_target(targets: Sequence[str], target: Optional[str]) -> str:
    """What to say when a source asks for `target` of a model that writes `targets` and not it
    (None: the source asked for none, and a model of several targets must be told which)."""
    choices = ", ".join(targets)
    if target is None:
        return f"this model translates into {choices}: say which"
    return f"this model does not translate into {target!r}; it translates into {choices}"


def primary_subtag(code: str) -> str:
    """The language of a code such as zh-CN, zh_Hans or EN: "zh", "zh", "en"."""
    return code.replace("_", "-").split("-")[0].strip().lower()


def is_unspaced(code: str) -> bool:
    return primary_subtag(code) in UNSPACED


def joiner(code: str) -> str:
    """What goes between two sentences (or parts of one) of this language: nothing, or a space."""
    return "" if is_unspaced(code) else " "


# Coordinating conjunctions: where a long sentence may be cut into clauses when no punctuation
# marks one (decoding/parts.py). A language not listed is cut at punctuation alone.
_CONJUNCTIONS = {
    "en": ("and", "but", "or", "so", "yet"),
    "de": ("und", "aber", "oder", "denn", "sondern"),
    "es": ("y", "pero", "o", "sino"),
    "fr": ("et", "mais", "ou", "donc", "car"),
    "it": ("e", "ma", "o", "però"),
    "nl": ("en", "maar", "of", "want"),
    "pt": ("e", "mas", "ou"),
    "zh": ("但是", "可是", "而且", "所以", "或者", "因此"),
}


def conjunctions(code: str) -> tuple[str, ...]:
    """The coordinating conjunctions of a code's language, lower case; () for one attn does not list."""
    return _CONJUNCTIONS.get(primary_subtag(code), ())


def bleu_tokenizer(code: str) -> str:
    """sacreBLEU's tokenizer for references in this language."""
    return _BLEU_TOKENIZERS.get(primary_subtag(code), "13a")


# English names by ISO 639-1 code: the languages Argos Translate's packages cover, and more.
_NAMES = {
    "af": "Afrikaans",
    "ar": "Arabic",
    "az": "Azerbaijani",
    "be": "Belarusian",
    "bg": "Bulgarian",
    "bn": "Bengali",
    "bo": "Tibetan",
    "ca": "Catalan",
    "cs": "Czech",
    "cy": "Welsh",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "eo": "Esperanto",
    "es": "Spanish",
    "et": "Estonian",
    "eu": "Basque",
    "fa": "Persian",
    "fi": "Finnish",
    "fr": "French",
    "ga": "Irish",
    "gl": "Galician",
    "he": "Hebrew",
    "hi": "Hindi",
    "hr": "Croatian",
    "hu": "Hungarian",
    "hy": "Armenian",
    "id": "Indonesian",
    "is": "Icelandic",
    "it": "Italian",
    "ja": "Japanese",
    "ka": "Georgian",
    "kk": "Kazakh",
    "km": "Khmer",
    "ko": "Korean",
    "ky": "Kyrgyz",
    "lo": "Lao",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "mk": "Macedonian",
    "ms": "Malay",
    "mt": "Maltese",
    "my": "Burmese",
    "nb": "Norwegian Bokmål",
    "nl": "Dutch",
    "nn": "Norwegian Nynorsk",
    "no": "Norwegian",
    "pl": "Polish",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "sk": "Slovak",
    "sl": "Slovenian",
    "sq": "Albanian",
    "sr": "Serbian",
    "sv": "Swedish",
    "sw": "Swahili",
    "ta": "Tamil",
    "te": "Telugu",
    "th": "Thai",
    "tl": "Tagalog",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "ur": "Urdu",
    "uz": "Uzbek",
    "vi": "Vietnamese",
    "zh": "Chinese",
}


def name(code: str) -> str:
    """The English name of a code's language ("zh-CN": "Chinese"); the code itself for one attn does not know."""
    return _NAMES.get(primary_subtag(code), code)
