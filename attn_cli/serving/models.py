"""What a server serves: one loaded model per language pair, found by its name or its languages.

A request names a model by its language codes as LibreTranslate clients do (`source`, `target`,
either read by its primary subtag: zh, zh-Hans and zh-CN are one language; `auto` is the served
source) or by the model's name (`en-zh`). Nothing a request says is ever a path: models are the
ones the command line loaded, looked up in this table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attn_cli import languages
from attn_cli.errors import UserError
from attn_cli.translator import Loaded


class RequestError(ValueError):
    """A request the server refuses: the message names the field at fault and how to fix it, and
    `status` is the HTTP status it is answered with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class ServedModel:
    name: str  # "en-zh": how /v1 requests and the page name it
    loaded: Loaded

    @property
    def source(self) -> str:
        return self.loaded.config.data.src_lang

    @property
    def target(self) -> str:
        return self.loaded.config.data.tgt_lang

    @property
    def backend(self) -> str:
        return "ctranslate2" if self.loaded.exported is not None else "pytorch"

    @property
    def has_attention(self) -> bool:
        """Whether attention maps can be taken: one checkpoint's own model (not an ensemble, not CTranslate2)."""
        return self.loaded.exported is None and not self.loaded.is_ensemble

    def describe(self) -> dict:
        config = self.loaded.config.model
        return {
            "name": self.name,
            "source": self.source,
            "target": self.target,
            "backend": self.backend,
            "files": [path.name for path in self.loaded.paths],
            "layers": {"encoder": config.encoder_layers, "decoder": config.decoder_layers},
            "heads": config.num_heads,
            "attention": self.has_attention,
            "decode": {
                key: getattr(self.loaded.config.decode, key) for key in ("beam_size", "n_best", "length_penalty")
            },
        }


class ServedModels:
    """The served models, each named by its language pair."""

    def __init__(self, loaded: Sequence[Loaded]):
        self.models: dict[str, ServedModel] = {}
        for model in loaded:
            config = model.config.data
            name = f"{config.src_lang}-{config.tgt_lang}"
            if name in self.models:
                raise UserError(
                    f"two models serve {name} ({self.models[name].loaded.paths[0]} and {model.paths[0]}); "
                    f"serve one model per language pair"
                )
            self.models[name] = ServedModel(name, model)
        if not self.models:
            raise ValueError("no models to serve")

    def __iter__(self):
        return iter(self.models.values())

    def named(self, name: str) -> ServedModel:
        if name not in self.models:
            raise RequestError(f"model: no model is named {name!r}; served: {', '.join(self.models)}")
        return self.models[name]

    def for_languages(self, source: str, target: str) -> ServedModel:
        """The model from `source` ("auto": any served source) to `target`; a RequestError naming
        the pairs that are served otherwise."""
        same = languages.primary_subtag
        found = [
            model
            for model in self
            if (source == "auto" or same(model.source) == same(source)) and same(model.target) == same(target)
        ]
        if len(found) == 1:
            return found[0]
        served = ", ".join(f"{m.source} -> {m.target}" for m in self)
        if not found:
            raise RequestError(f"source/target: no model translates {source} -> {target}; served: {served}")
        raise RequestError(f"source: several served models translate into {target} ({served}); name the source")

    def languages(self) -> list[dict]:
        """LibreTranslate's /languages: every served language with the codes it translates into."""
        targets: dict[str, list[str]] = {}
        for model in self:
            targets.setdefault(model.source, []).append(model.target)
            targets.setdefault(model.target, [])
        return [{"code": code, "name": languages.name(code), "targets": found} for code, found in targets.items()]
