"""What attn needs to know of a language, from its code: one rule for each fact.

A code is read by its primary subtag, case aside: `zh`, `ZH`, `zh-CN`, `zh_Hans` and `zh-Hant-TW`
are all Chinese. Languages written without spaces between words (and sentences) join the parts of a
split input, and the sentences of a joined training pair, with nothing between them; the others
with a space. BLEU tokenizes each language as sacreBLEU recommends: by character for Chinese, with
MeCab for Japanese and Korean, with its 13a tokenizer otherwise.
"""

from __future__ import annotations

# ISO 639-1 codes of the languages written without spaces: Chinese, Japanese, Thai, Lao, Khmer,
# Burmese, Tibetan.
UNSPACED = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo"})
_BLEU_TOKENIZERS = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}
# English names of the commonest codes, for what a server or a package shows; others show their code.
_NAMES = {
    "ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek", "en": "English",
    "es": "Spanish", "fa": "Persian", "fi": "Finnish", "fr": "French", "he": "Hebrew", "hi": "Hindi",
    "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian",
    "sv": "Swedish", "th": "Thai", "tr": "Turkish", "uk": "Ukrainian", "vi": "Vietnamese",
    "zh": "Chinese",
}  # fmt: skip


def primary_subtag(code: str) -> str:
    """The language of a code such as zh-CN, zh_Hans or EN: "zh", "zh", "en"."""
    return code.replace("_", "-").split("-")[0].strip().lower()


def is_unspaced(code: str) -> bool:
    return primary_subtag(code) in UNSPACED


def joiner(code: str) -> str:
    """What goes between two sentences (or parts of one) of this language: nothing, or a space."""
    return "" if is_unspaced(code) else " "


def bleu_tokenizer(code: str) -> str:
    """sacreBLEU's tokenizer for references in this language."""
    return _BLEU_TOKENIZERS.get(primary_subtag(code), "13a")


def name(code: str) -> str:
    """The language's English name ("zh-CN" -> "Chinese"), or the code itself when it is not known."""
    return _NAMES.get(primary_subtag(code), code)
