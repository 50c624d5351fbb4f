"""SentencePiece tokenizers: training, loading, batch encode/decode, with fixed special ids.

A `Tokenizers` pair holds the source and the target model; with a joint vocabulary both are the
same object. The serialized models travel inside every checkpoint, so a checkpoint alone can
translate.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import sentencepiece as spm

from attn_cli.config import TokenizerConfig
from attn_cli.errors import UserError
from attn_cli.files import write_whole
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID


class TokenizerError(UserError, ValueError):
    """Tokenizer training or loading failed; the message names the config key to change."""


class Tokenizer:
    """One SentencePiece model, built from its serialized bytes."""

    def __init__(self, model_proto: bytes, origin: str = "the tokenizer model"):
        self.model_proto = model_proto
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        except (RuntimeError, TypeError):  # SentencePiece's own message only says the parse failed
            raise TokenizerError(f"{origin} is not a SentencePiece model (damaged, or another kind of file)") from None
        if (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id()) != (
            PAD_ID,
            UNK_ID,
            BOS_ID,
            EOS_ID,
        ):
            raise TokenizerError(
                "tokenizer model has unexpected special ids; retrain it with `attn tokenizer --retrain`"
            )

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        try:
            return cls(Path(path).read_bytes(), str(path))
        except TokenizerError as error:
            raise TokenizerError(f"{error}; train it again with `attn tokenizer --retrain`") from None

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids without BOS/EOS; the batcher and the decoder add those."""
        return self._sp.encode(list(texts), out_type=int)

    def encode_pieces(self, texts: Sequence[str]) -> list[list[str]]:
        return self._sp.encode(list(texts), out_type=str)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Texts of id sequences, padding, BOS and EOS left out. An unknown piece stays visible, as
        SentencePiece writes it (" ⁇ "): a word the vocabulary lacks must not vanish from an output."""
        return self._sp.decode([[i for i in seq if i == UNK_ID or i > EOS_ID] for seq in ids])

    def piece_to_id(self, piece: str) -> int:
        return self._sp.piece_to_id(piece)

    def id_to_piece(self, ids: Sequence[int]) -> list[str]:
        return [self._sp.id_to_piece(i) for i in ids]

    def piece_texts(self) -> list[str | None]:
        """Per id, the text the piece adds to an output (▁ is a space); None for the pieces that add
        none of their own: the special ones, <unk>, and byte pieces (a byte is not a character)."""
        sp = self._sp
        return [
            None if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) else sp.id_to_piece(i).replace("▁", " ")
            for i in range(self.vocab_size)
        ]


@dataclass(frozen=True)
class Tokenizers:
    source: Tokenizer
    target: Tokenizer

    @property
    def joint(self) -> bool:
        return self.source is self.target

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for old in ("joint.model", "source.model", "target.model"):  # a retrain may switch joint <-> separate
            (directory / old).unlink(missing_ok=True)
        if self.joint:
            write_whole(directory / "joint.model", self.source.model_proto)
        else:  # a run that stops between the two has no pair, and trains the tokenizer again
            write_whole(directory / "source.model", self.source.model_proto)
            write_whole(directory / "target.model", self.target.model_proto)

    @classmethod
    def load(cls, directory: str | Path) -> "Tokenizers":
        directory = Path(directory)
        if (directory / "joint.model").is_file():
            joint = Tokenizer.load(directory / "joint.model")
            return cls(joint, joint)
        return cls(Tokenizer.load(directory / "source.model"), Tokenizer.load(directory / "target.model"))

    @staticmethod
    def exists(directory: str | Path) -> bool:
        directory = Path(directory)
        return (directory / "joint.model").is_file() or (
            (directory / "source.model").is_file() and (directory / "target.model").is_file()
        )

    def to_state(self) -> dict:
        return {"source": self.source.model_proto, "target": None if self.joint else self.target.model_proto}

    @classmethod
    def from_state(cls, state: dict) -> "Tokenizers":
        source = Tokenizer(state["source"])
        return cls(source, source if state["target"] is None else Tokenizer(state["target"]))


def train_sentencepiece(sentences: Iterable[str], cfg: TokenizerConfig, seed: int = 1) -> Tokenizer:
    """Train one SentencePiece model in memory on the given sentences."""
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
            # Sentences are short and numerous; shuffled input keeps sampling fair.
            input_sentence_size=cfg.max_training_sentences,
            shuffle_input_sentence=True,
            num_threads=2,
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
    src_sentences: Sequence[str], tgt_sentences: Sequence[str], cfg: TokenizerConfig, seed: int = 1
) -> Tokenizers:
    if cfg.joint:
        joint = train_sentencepiece(list(src_sentences) + list(tgt_sentences), cfg, seed)
        return Tokenizers(joint, joint)
    return Tokenizers(train_sentencepiece(src_sentences, cfg, seed), train_sentencepiece(tgt_sentences, cfg, seed))
