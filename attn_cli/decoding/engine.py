"""What translates: the `Engine` protocol that the pipeline decodes with, what each engine can do
(`Capabilities`), and the one rule that says which options and sources an engine refuses.

There are two engines (attn_cli/engines/): attn's own PyTorch searches over one checkpoint or an
ensemble, and a CTranslate2 model that `attn export` wrote. `refusals` answers "can this engine do
what was asked?" once for every caller; the command line words a refusal with its flags and the
server with its request fields (`Wording`), so `attn translate`, `attn eval` and `attn serve`
refuse alike. Imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

from attn_cli.languages import unwritten_target

if TYPE_CHECKING:
    from attn_cli.config import Config, DecodeConfig
    from attn_cli.data.lengths import LengthModel
    from attn_cli.data.tokenizer import Tokenizers
    from attn_cli.decoding.glossary import TokenTerm
    from attn_cli.decoding.hypothesis import Hypothesis
    from attn_cli.decoding.records import Part, Source


class Searcher(Protocol):
    """An engine's configured search, called once per decoding batch."""

    def __call__(
        self, parts: Sequence[Part], terms: Optional[Sequence[Sequence[TokenTerm]]] = None
    ) -> list[list[Hypothesis]]:
        """Each part's hypotheses, best first; with `terms` (each part's terms as token alternatives),
        a constrained search in which a part whose terms cannot be placed gets none."""
        ...


StopCheck = Callable[[], bool]  # asked between a search's steps: True stops it (nobody waits for it)


class SearchStopped(Exception):
    """A search that its caller's `StopCheck` stopped between two steps."""


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do beyond searching plain sources."""

    name: str  # how a message names the engine: "CTranslate2", "an ensemble of 2 checkpoints"
    backend: str  # "pytorch" or "ctranslate2"
    prefix: bool  # forces a target prefix
    terms: bool  # places glossary terms (a constrained search)
    attention: bool  # gives one model's attention weights
    output_rules: bool  # keeps attn's output rules (valid UTF-8, decode.no_stutter) inside its search
    sampling: bool


class Engine(Protocol):
    """A thing that translates sources: a model, its tokenizers and its limits, searched in batches."""

    config: Config  # its decode settings and languages (an ensemble's: its first member's)
    tokenizers: Tokenizers
    paths: list[Path]  # the checkpoint files, or the exported model's directory
    capabilities: Capabilities
    max_source_tokens: int  # the longest source it takes, without the EOS
    max_target_tokens: Optional[int]  # the longest output it can write (None: no end)
    lengths: Optional[LengthModel]  # its training pairs' lengths (data/lengths.py); None when not known

    def searcher(self, options: DecodeConfig, stop: Optional[StopCheck] = None) -> Searcher:
        """The configured search, for the batches of one translation call (a seeded sample repeats);
        it raises SearchStopped between steps once `stop` says so."""
        ...

    def attention(self, part: Part, tokens: Sequence[int]) -> Any:
        """(AttentionMaps, source pieces, target pieces) of `tokens` as the output of `part`."""
        ...


def places_terms(options: DecodeConfig) -> bool:
    """Whether the configured search can place a glossary's terms: the beam search alone can, for
    greedy search and sampling keep one hypothesis a step, with no room for one writing a term."""
    return not options.sample and options.beam_size >= 2


@dataclass(frozen=True)
class Refusal:
    """Why an engine will not do something it was asked: `option` names what was asked (a Source
    field or a decode key), `fix` the kind of remedy. A warning is told, and the work goes on."""

    option: str  # "prefix", "terms", "sample", "attention", "no_stutter"
    reason: str
    fix: str  # "checkpoint", "one_checkpoint", "beam", "allow_stutter"
    warning: bool = False

    def message(self, wording: Wording) -> str:
        return f"{wording.names[self.option]}: {self.reason}; {wording.fixes[self.fix]}"


@dataclass(frozen=True)
class Wording:
    """How a caller names what was asked and what fixes it: the command line by flags, a server by fields."""

    names: dict[str, str]  # option -> its flag or field
    fixes: dict[str, str]  # fix -> what to do, in the caller's terms


def target_refusals(engine: Engine, sources: Sequence[Source], required: bool = True) -> list[Refusal]:
    """The first source that asks for a language the model does not write, or (when `required`)
    asks for none of a model of several target languages: a refusal naming the languages it writes."""
    from attn_cli.config import ConfigError

    data = engine.config.data
    for source in sources:
        if source.target is None and required and engine.tokenizers.multi_target:
            return [Refusal("target", unwritten_target(data.target_languages, None), "target")]
        if source.target is not None:
            try:
                data.direction_into(source.target)
            except ConfigError as error:
                return [Refusal("target", error.problem, "target")]
    return []


def refusals(capabilities: Capabilities, options: DecodeConfig, sources: Sequence[Source]) -> list[Refusal]:
    """What the engine refuses of `options` and `sources`, warnings last; [] when it can do it all."""
    found = []
    if not capabilities.prefix and any(source.prefix.strip() for source in sources):
        found.append(
            Refusal("prefix", f"{capabilities.name} does not force a prefix; attn's own search does", "checkpoint")
        )
    if any(source.terms for source in sources):
        if not capabilities.terms:
            found.append(
                Refusal("terms", f"{capabilities.name} has no constrained search to place terms", "checkpoint")
            )
        elif not places_terms(options):
            how = "sampling" if options.sample else "greedy search (beam 1)"
            found.append(Refusal("terms", f"terms are placed by beam search, and {how} cannot place them", "beam"))
    if options.sample and not capabilities.sampling:
        found.append(Refusal("sample", f"{capabilities.name} does not sample", "checkpoint"))
    if not capabilities.attention and any(source.attention for source in sources):
        found.append(
            Refusal("attention", f"{capabilities.name} gives no one model's attention weights", "one_checkpoint")
        )
    if not capabilities.output_rules and options.no_stutter:
        found.append(
            Refusal(
                "no_stutter",
                f"{capabilities.name} searches on its own and cannot keep to decode.no_stutter (nor to valid "
                f"UTF-8) as attn's own search does, so outputs may differ from a checkpoint's",
                "allow_stutter",
                warning=True,
            )
        )
    return found
