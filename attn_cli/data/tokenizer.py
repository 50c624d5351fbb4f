"""SentencePiece tokenizers: training, loading, batch encode/decode, with fixed special ids.

A `Tokenizers` pair holds the source and the target model; with a joint vocabulary both are the
same object. The serialized models travel inside every checkpoint, so a checkpoint alone can
translate.

A model imported from elsewhere (Marian's OPUS-MT models, attn_cli/huggingface/) may bring two
SentencePiece models that share one vocabulary whose ids are not SentencePiece's own: the
tokenizer then carries that vocabulary, a piece per model id, and maps pieces through it. A
`source_prefix` token (">>cmn_Hans<<", the target language of a multi-target model) goes before
every source sentence.

A corpus of data.corpora may carry a tag (`<bt>` for back-translated pairs, or a domain): a piece
of its own, put before each of that corpus's sources when it is prepared. A source text that
begins with a known tag and a space ("<bt> Hello.") is encoded the same way, so a tag typed at
translation time gives the ids the model was trained on.
"""

from __future__ import annotations

import io
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

import sentencepiece as spm

from attn_cli.config import TokenizerConfig
from attn_cli.errors import UserError
from attn_cli.files import write_whole
from attn_cli.languages import unwritten_target
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# Below this many texts, SentencePiece is called once per text rather than with the list (its
# thread pool's start costs more than it saves; the two cross near 100 short sentences).
SMALL_BATCH = 100


class TokenizerError(UserError, ValueError):
    """Tokenizer training or loading failed; the message names the config key to change."""


# The pieces a vocabulary of its own names attn's special ids by, in id order (PAD_ID .. EOS_ID).
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")

# Where a tokenizer directory keeps what the SentencePiece files do not hold: the vocabulary of
# its own and the source prefix, when there are any.
SETTINGS_FILE = "tokenizer.json"


class Tokenizer:
    """One SentencePiece model, built from its serialized bytes; with a `vocabulary` (a piece per
    id), ids are positions in it, and a piece it lacks is <unk>."""

    def __init__(
        self, model_proto: bytes, origin: str = "the tokenizer model", vocabulary: Optional[Sequence[str]] = None
    ):
        self.model_proto = model_proto
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        except (RuntimeError, TypeError):  # SentencePiece's own message only says the parse failed
            raise TokenizerError(f"{origin} is not a SentencePiece model (damaged, or another kind of file)") from None
        self.vocabulary = None if vocabulary is None else list(vocabulary)
        if self.vocabulary is not None:
            self._ids = {piece: i for i, piece in enumerate(self.vocabulary)}
            if tuple(self.vocabulary[: len(SPECIAL_PIECES)]) != SPECIAL_PIECES or len(self._ids) != len(
                self.vocabulary
            ):
                raise TokenizerError(
                    f"the vocabulary of {origin} must begin with {', '.join(SPECIAL_PIECES)} and name each piece "
                    f"once; import the model again with `attn import`"
                )
        elif (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id()) != (
            PAD_ID,
            UNK_ID,
            BOS_ID,
            EOS_ID,
        ):
            raise TokenizerError(
                "tokenizer model has unexpected special ids; retrain it with `attn tokenizer --retrain`"
            )

    @classmethod
    def load(cls, path: str | Path, vocabulary: Optional[Sequence[str]] = None) -> "Tokenizer":
        try:
            return cls(Path(path).read_bytes(), str(path), vocabulary)
        except TokenizerError as error:
            if vocabulary is not None:  # an imported tokenizer: retraining would replace the model's own
                raise
            raise TokenizerError(f"{error}; train it again with `attn tokenizer --retrain`") from None

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size() if self.vocabulary is None else len(self.vocabulary)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids without BOS/EOS; the batcher and the decoder add those."""
        if self.vocabulary is None:
            return self._each_or_batch(self._sp.encode, list(texts), out_type=int)
        return [[self._ids.get(piece, UNK_ID) for piece in pieces] for pieces in self.encode_pieces(texts)]

    def encode_pieces(self, texts: Sequence[str]) -> list[list[str]]:
        return self._each_or_batch(self._sp.encode, list(texts), out_type=str)

    @staticmethod
    def _each_or_batch(call, items: list, **options) -> list:
        """SentencePiece's list calls start a thread pool, which costs more than a short sentence's
        own encoding: fewer items than SMALL_BATCH go one by one (a server's request)."""
        if len(items) < SMALL_BATCH:
            return [call(item, **options) for item in items]
        return call(items, **options)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Texts of id sequences, padding, BOS and EOS left out. An unknown piece stays visible, as
        SentencePiece writes it (" ⁇ "): a word the vocabulary lacks must not vanish from an output.

        With a vocabulary of its own (an imported Marian model), an id may name a piece this
        SentencePiece model lacks: vocab.json joins the pieces of the source side to the target's,
        and a model writes them too (a name copied into a Chinese output). SentencePiece writes such
        a piece as it is, ▁ and all ("我们▁quit"); Transformers' MarianTokenizer makes every ▁ left a
        space and trims the text's ends ("我们 quit"), and so does this."""
        kept = [[i for i in seq if i == UNK_ID or i > EOS_ID] for seq in ids]
        if self.vocabulary is None:
            return self._each_or_batch(self._sp.decode, kept)
        texts = (self._sp.decode_pieces([self.vocabulary[i] for i in seq]) for seq in kept)
        return [text.replace("▁", " ").strip() for text in texts]

    def piece_to_id(self, piece: str) -> int:
        return self._sp.piece_to_id(piece) if self.vocabulary is None else self._ids.get(piece, UNK_ID)

    def id_to_piece(self, ids: Sequence[int]) -> list[str]:
        if self.vocabulary is None:
            return [self._sp.id_to_piece(i) for i in ids]
        return [self.vocabulary[i] for i in ids]

    def piece_texts(self) -> list[str | None]:
        """Per id, the text the piece adds to an output (▁ is a space); None for the pieces that add
        none of their own: the special ones, <unk>, and byte pieces (a byte is not a character)."""
        sp = self._sp
        if self.vocabulary is None:
            return [
                None if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) else sp.id_to_piece(i).replace("▁", " ")
                for i in range(self.vocab_size)
            ]
        texts: list[str | None] = [None] * len(SPECIAL_PIECES)
        for piece in self.vocabulary[len(SPECIAL_PIECES) :]:
            own = sp.piece_to_id(piece)  # SentencePiece's id, or its <unk> for a piece it lacks
            special = sp.is_control(own) or sp.is_byte(own) or (sp.is_unknown(own) and piece == sp.id_to_piece(own))
            texts.append(None if special else piece.replace("▁", " "))
        return texts


@dataclass(frozen=True)
class Tokenizers:
    source: Tokenizer
    target: Tokenizer
    source_prefix: Optional[str] = None  # tokenizer.source_prefix: a piece put before every source sentence
    tags: tuple[str, ...] = ()  # the tags of data.corpora, each a piece of the source vocabulary
    # The piece that asks for each target language of a multi-target model ({"zh": ">>zh<<"}),
    # put before every source; empty for a model of one target language.
    target_tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.source_prefix is not None and self.source.piece_to_id(self.source_prefix) == UNK_ID:
            raise TokenizerError(
                f"tokenizer.source_prefix {self.source_prefix!r} is not a piece of the source vocabulary; "
                f"name one of its pieces, or train the tokenizer again with `attn tokenizer --retrain`"
            )
        for tag in (*self.tags, *self.target_tags.values()):
            if self.source.piece_to_id(tag) == UNK_ID:
                raise TokenizerError(
                    f"the corpus tag {tag!r} is not a piece of the source vocabulary; "
                    f"train the tokenizer again with `attn tokenizer --retrain`"
                )

    @property
    def joint(self) -> bool:
        """One vocabulary for both languages: one SentencePiece model, or two sharing one vocabulary."""
        shared = self.source.vocabulary is not None and self.source.vocabulary == self.target.vocabulary
        return self.source is self.target or shared

    @property
    def prefix_ids(self) -> list[int]:
        """The ids put before every source: the source prefix's, or none."""
        return [] if self.source_prefix is None else [self.source.piece_to_id(self.source_prefix)]

    @property
    def multi_target(self) -> bool:
        """Whether a source must say which target language it asks for (its target tag)."""
        return bool(self.target_tags)

    def encode_sources(self, texts: Sequence[str], target: Optional[str] = None) -> list[list[int]]:
        """Source ids without EOS (the batcher adds it): each text's lead (`source_lead`, asking a
        multi-target model for `target` unless the text begins with a target tag), then its tokens;
        an empty text stays empty: there is nothing to translate."""
        if not self.tags and not self.target_tags:
            return self.prefixed(self.source.encode(texts))
        leads = [self.source_lead(text, target) for text in texts]
        rows = self.source.encode([rest for _, rest in leads])
        return [[*lead, *row] if row else row for (lead, _), row in zip(leads, rows)]

    def source_lead(self, text: str, target: Optional[str] = None) -> tuple[list[int], str]:
        """The ids put before a source's tokens, and the rest of the text to tokenize: the source
        prefix; a multi-target model's target tag (`target`'s, else the one the text begins with,
        ">>zh<< Hello."); then the corpus tag the text begins with ("<bt> Hello.")."""
        typed, text = self._split_tag(text, self.target_tags.values())
        tag, rest = self.split_tag(text)
        lead = [*self.prefix_ids]
        if self.target_tags:
            wanted = self.target_tags.get(target) if target is not None else typed
            if wanted is None:
                raise TokenizerError(self.unknown_target(target))
            lead.append(self.source.piece_to_id(wanted))
        return [*lead, *([self.source.piece_to_id(tag)] if tag else [])], rest

    def unknown_target(self, target: Optional[str]) -> str:
        """What to say of a target language this model does not write (None: none was asked for)."""
        found = unwritten_target(list(self.target_tags), target)
        return f'{found} (--target, or a "target" field)' if target is None else found

    def decode_sources(self, rows: Sequence[Sequence[int]]) -> list[str]:
        """The texts of source ids as `encode_sources` takes them: the source prefix left out (it
        is put back), the target tag and the corpus tag typed before the text."""
        lead = len(self.prefix_ids)
        tag_ids = {self.source.piece_to_id(tag): tag for tag in (*self.target_tags.values(), *self.tags)}
        rows = [list(row[lead:]) if lead and list(row[:lead]) == self.prefix_ids else list(row) for row in rows]
        tags = []
        for row in rows:
            found = []
            while len(row) > len(found) and row[len(found)] in tag_ids and len(found) < 2:
                found.append(tag_ids[row[len(found)]])
            tags.append(found)
        texts = self.source.decode([row[len(found) :] for row, found in zip(rows, tags)])
        return [" ".join([*found, text]) if found else text for found, text in zip(tags, texts)]

    def split_tag(self, text: str) -> tuple[Optional[str], str]:
        """(the corpus tag `text` begins with, the rest of it), or (None, `text`)."""
        return self._split_tag(text, self.tags)

    def split_leading_tags(self, text: str) -> tuple[str, str]:
        """(the target tag and corpus tag `text` begins with, as typed, the rest of it)."""
        target, rest = self._split_tag(text, self.target_tags.values())
        tag, rest = self.split_tag(rest)
        return " ".join(t for t in (target, tag) if t), rest

    @staticmethod
    def _split_tag(text: str, tags) -> tuple[Optional[str], str]:
        for tag in tags:
            if text.startswith(tag) and (len(text) == len(tag) or text[len(tag)].isspace()):
                return tag, text[len(tag) :].lstrip()
        return None, text

    def prefixed(self, rows: Sequence[list[int]]) -> list[list[int]]:
        """Source ids with the source prefix put first; an empty row stays empty: there is nothing
        to translate."""
        lead = self.prefix_ids
        return [[*lead, *row] if row else row for row in rows]

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # a retrain may switch joint <-> separate, or leave an imported vocabulary behind
        for old in ("joint.model", "source.model", "target.model", SETTINGS_FILE):
            (directory / old).unlink(missing_ok=True)
        if self.source is self.target:
            write_whole(directory / "joint.model", self.source.model_proto)
        else:  # a run that stops between the two has no pair, and trains the tokenizer again
            write_whole(directory / "source.model", self.source.model_proto)
            write_whole(directory / "target.model", self.target.model_proto)
        settings = self._settings()
        if any(value is not None for value in settings.values()):
            write_whole(directory / SETTINGS_FILE, json.dumps(settings, ensure_ascii=False, indent=1) + "\n")

    def _settings(self) -> dict:
        settings = {"vocabulary": self.source.vocabulary, "source_prefix": self.source_prefix}
        if self.tags:
            settings["tags"] = list(self.tags)
        if self.target_tags:
            settings["target_tags"] = dict(self.target_tags)
        return settings

    @classmethod
    def load(cls, directory: str | Path) -> "Tokenizers":
        directory = Path(directory)
        settings_file = directory / SETTINGS_FILE
        try:
            settings = json.loads(settings_file.read_text(encoding="utf-8")) if settings_file.is_file() else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise TokenizerError(
                f"{settings_file} is damaged ({error}); import or train the model again, or restore the file"
            ) from None
        vocabulary, prefix = settings.get("vocabulary"), settings.get("source_prefix")
        tags, target_tags = tuple(settings.get("tags", ())), dict(settings.get("target_tags", {}))
        if (directory / "joint.model").is_file():
            joint = Tokenizer.load(directory / "joint.model", vocabulary)
            return cls(joint, joint, prefix, tags, target_tags)
        return cls(
            Tokenizer.load(directory / "source.model", vocabulary),
            Tokenizer.load(directory / "target.model", vocabulary),
            prefix,
            tags,
            target_tags,
        )

    @staticmethod
    def exists(directory: str | Path) -> bool:
        directory = Path(directory)
        return (directory / "joint.model").is_file() or (
            (directory / "source.model").is_file() and (directory / "target.model").is_file()
        )

    def to_state(self) -> dict:
        target = None if self.source is self.target else self.target.model_proto
        return {"source": self.source.model_proto, "target": target, **self._settings()}

    @classmethod
    def from_state(cls, state: dict) -> "Tokenizers":
        """A checkpoint's tokenizers; one saved before vocabularies, prefixes and tags has none."""
        vocabulary = state.get("vocabulary")
        source = Tokenizer(state["source"], vocabulary=vocabulary)
        target = source if state["target"] is None else Tokenizer(state["target"], vocabulary=vocabulary)
        return cls(
            source, target, state.get("source_prefix"), tuple(state.get("tags", ())), dict(state.get("target_tags", {}))
        )


def train_sentencepiece(
    sentences: Iterable[str], cfg: TokenizerConfig, seed: int = 1, symbols: Sequence[str] = ()
) -> Tokenizer:
    """Train one SentencePiece model in memory on the given sentences; each of `symbols` becomes a
    piece of its own (tokenizer.source_prefix)."""
    sentences = [s for s in sentences if s.strip()]
    if len(sentences) > cfg.max_training_sentences:
        sentences = random.Random(seed).sample(sentences, cfg.max_training_sentences)
    if not sentences:
        raise TokenizerError("no sentences to train the tokenizer on; check data.corpus")
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)  # the trainer's sampling, for repeatable vocabularies
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            model_type=cfg.model_type,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage,
            byte_fallback=cfg.byte_fallback,
            normalization_rule_name=cfg.normalization,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            user_defined_symbols=list(symbols),
            # Sentences are short and numerous; shuffled input keeps sampling fair.
            input_sentence_size=cfg.max_training_sentences,
            shuffle_input_sentence=True,
            num_threads=cfg.threads or os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as error:
        raise TokenizerError(_explain_training_error(str(error), cfg)) from None
    return Tokenizer(model.getvalue())


def _explain_training_error(message: str, cfg: TokenizerConfig) -> str:
    """SentencePiece's internal messages, translated into the config key to change."""
    if "smaller than required_chars" in message:
        needed = message.split(" vs ")[-1].split(".")[0] if " vs " in message else "more"
        return (
            f"tokenizer.vocab_size={cfg.vocab_size} is too small: the corpus needs {needed} pieces for its "
            f"characters alone; raise tokenizer.vocab_size or lower tokenizer.character_coverage"
        )
    if "Vocabulary size too high" in message:
        return (
            f"tokenizer.vocab_size={cfg.vocab_size} is too large for this corpus; "
            f"lower tokenizer.vocab_size ({message.strip()})"
        )
    return f"SentencePiece training failed: {message.strip()}"


def train_tokenizers(
    src_sentences: Sequence[str],
    tgt_sentences: Sequence[str],
    cfg: TokenizerConfig,
    seed: int = 1,
    tags: Sequence[str] = (),
    target_tags: Optional[dict[str, str]] = None,
) -> Tokenizers:
    """Tokenizers trained on these sentences; the source prefix, each of `tags` (data.corpora's)
    and each target tag become pieces of the source vocabulary."""
    target_tags = dict(target_tags or {})
    symbols = [*([] if cfg.source_prefix is None else [cfg.source_prefix]), *target_tags.values(), *tags]
    if cfg.joint:
        joint = train_sentencepiece(list(src_sentences) + list(tgt_sentences), cfg, seed, symbols)
        return Tokenizers(joint, joint, cfg.source_prefix, tuple(tags), target_tags)
    return Tokenizers(
        train_sentencepiece(src_sentences, cfg, seed, symbols),
        train_sentencepiece(tgt_sentences, cfg, seed),
        cfg.source_prefix,
        tuple(tags),
        target_tags,
    )
