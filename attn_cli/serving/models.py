"""What a server serves: one loaded model per language pair, found by its name or its languages.

A request names a model by its language codes as LibreTranslate clients do (`source`, `target`,
either read by its primary subtag: zh, zh-Hans and zh-CN are one language; `auto` is the served
source) or by the model's name (`en-zh`). Nothing a request says is ever a path: models are the
ones the command line loaded, looked up in this table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from attn_cli import languages
from attn_cli.errors import UserError
from attn_cli.languages import Direction
from attn_cli.serving.errors import RequestError

if TYPE_CHECKING:
    from attn_cli.decoding.engine import Engine


@dataclass
class ServedModel:
    """One direction a loaded model translates in: a model of several directions is served as one
    ServedModel per direction, sharing its engine (and its worker)."""

    name: str  # "en-zh": how /v1 requests and the page name it
    engine: Engine
    direction: Direction
    worker: str  # the name of the worker that decodes for its engine: its engine's first direction

    @property
    def source(self) -> str:
        return self.direction.source

    @property
    def target(self) -> str:
        return self.direction.target

    @property
    def asks_target(self) -> Optional[str]:
        """The target its sources ask for: its target language for a model of several, else None."""
        return self.target if self.engine.tokenizers.multi_target else None

    @property
    def backend(self) -> str:
        return self.engine.capabilities.backend

    def describe(self) -> dict:
        config = self.engine.config.model
        return {
            "name": self.name,
            "source": self.source,
            "target": self.target,
            "backend": self.backend,
            "files": [path.name for path in self.engine.paths],
            "layers": {"encoder": config.encoder_layers, "decoder": config.decoder_layers},
            "heads": config.num_heads,
            "attention": self.engine.capabilities.attention,
            "decode": {
                key: getattr(self.engine.config.decode, key) for key in ("beam_size", "n_best", "length_penalty")
            },
        }


class ServedModels:
    """The served models, each direction of each named by its language pair."""

    def __init__(self, engines: Sequence[Engine]):
        self.models: dict[str, ServedModel] = {}
        self.engines: dict[str, Engine] = {}  # by the name of the worker that decodes for it
        for engine in engines:
            directions = engine.config.data.directions
            worker = str(directions[0])
            for direction in directions:
                name = str(direction)
                if name in self.models:
                    raise UserError(
                        f"two models serve {name} ({self.models[name].engine.paths[0]} and {engine.paths[0]}); "
                        f"serve one model per language pair"
                    )
                self.models[name] = ServedModel(name, engine, direction, worker)
            self.engines[worker] = engine
        if not self.models:
            raise ValueError("no models to serve")

    def __iter__(self):
        return iter(self.models.values())

    def choose(self, name: Optional[str], source: Optional[str], target: Optional[str]) -> ServedModel:
        """The model a request names: by `name`, else by its languages (`source` None: "auto"), else
        the only one served."""
        if name is not None:
            return self.named(name)
        if target is not None:
            return self.for_languages(source or "auto", target)
        if len(self.models) == 1:
            return next(iter(self))
        raise RequestError(f"model: several models are served ({', '.join(self.models)}); name one")

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
