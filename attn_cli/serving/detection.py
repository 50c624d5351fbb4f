"""Which language a text is in, for LibreTranslate's /detect and `source: auto`.

py3langid (Lui and Baldwin's langid.py, its model shipped in the package: nothing is downloaded)
classifies the text among the languages the server's models read or write, with probabilities
normalised over them. Restricting it to those languages is what makes it right on short sentences
(the unrestricted classifier takes "Wait for me." for Nigerian Pidgin): a server that
translates English to Chinese is asked which of the two a text is in, and a Chinese text is then
refused by name rather than translated as if it were English. A language outside the server's is
reported as the nearest of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attn_cli.languages import primary_subtag
from attn_cli.serving.errors import RequestError


@dataclass(frozen=True)
class Detected:
    language: str  # a served code, as the models spell it
    confidence: float  # 0-100, over the server's languages

    def to_dict(self) -> dict:
        return {"confidence": round(self.confidence, 1), "language": self.language}


class LanguageDetector:
    """The classifier over `codes` (the served models' languages); py3langid is loaded on first use."""

    def __init__(self, codes: Sequence[str]):
        self.codes = list(dict.fromkeys(codes))
        self._identifier = None
        self._known: dict[str, str] = {}  # py3langid's code -> the served code

    def detect(self, text: str) -> list[Detected]:
        """The server's languages, likeliest first."""
        identifier = self._loaded()
        if len(self._known) < 2:  # nothing to choose between
            return [Detected(code, 100.0 if i == 0 else 0.0) for i, code in enumerate(self.codes)]
        ranked = identifier.rank(text)
        return [Detected(self._known[code], 100.0 * float(p)) for code, p in ranked if code in self._known]

    def _loaded(self):
        if self._identifier is None:
            try:
                from py3langid.langid import MODEL_FILE, LanguageIdentifier
            except ImportError:
                raise RequestError(
                    'detecting a language needs py3langid: pip install "attn-cli[serve]" where attn serve runs, '
                    "or give source",
                    501,
                ) from None
            identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
            supported = set(identifier.nb_classes)
            self._known = {primary_subtag(code): code for code in self.codes if primary_subtag(code) in supported}
            if len(self._known) >= 2:
                identifier.set_languages(sorted(self._known))
            self._identifier = identifier
        return self._identifier
