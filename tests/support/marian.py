"""A small random Marian model (MarianMTModel) as save_pretrained leaves it, built here with transformers:
SiLU, a logits bias, Marian's own vocabulary over two SentencePiece models, two target-language tokens."""

from __future__ import annotations

import io
import json
import lzma
from pathlib import Path

from attn_cli.data.builtin_corpora import corpus_file

LANGUAGE_TOKENS = [">>cmn_Hans<<", ">>yue_Hant<<"]


def corpus_pairs(count: int) -> list[tuple[str, str]]:
    with lzma.open(corpus_file("builtin:tatoeba-cmn-eng"), "rt", encoding="utf-8") as lines:
        pairs = [tuple(line.split("\t")[:2]) for line, _ in zip(lines, range(count * 4))]
    return pairs[::4][:count]  # the file is ordered by length: every fourth pair, short and longer


def _sentencepiece(sentences: list[str], vocab_size: int) -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        character_coverage=0.98,
        byte_fallback=False,
        hard_vocab_limit=False,
        minloglevel=2,
    )  # SentencePiece's own ids (<unk> 0, <s> 1, </s> 2), as Marian's models have: not attn's
    return model.getvalue()


def build_marian(directory: Path, seed: int = 0) -> Path:
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel

    pairs = corpus_pairs(1500)
    source_model = _sentencepiece([p[0] for p in pairs], 300)
    target_model = _sentencepiece([p[1] for p in pairs], 800)
    pieces = ["</s>", "<unk>", *LANGUAGE_TOKENS]
    for proto in (source_model, target_model):
        processor = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if not processor.is_control(i) and not processor.is_unknown(i) and piece not in pieces:
                pieces.append(piece)
    pieces.append("<pad>")
    size = len(pieces)
    config = MarianConfig(
        vocab_size=size,
        decoder_vocab_size=size,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=size - 1,
        eos_token_id=0,
        decoder_start_token_id=size - 1,
        forced_eos_token_id=0,
        max_position_embeddings=128,
        init_std=0.15,
        dropout=0.1,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    with torch.no_grad():  # a bias that matters, and an end of sentence that comes at varied lengths
        model.final_logits_bias.normal_(0.0, 1.0)
        model.final_logits_bias[0, 0] = 1.5
    model.save_pretrained(directory)
    (directory / "source.spm").write_bytes(source_model)
    (directory / "target.spm").write_bytes(target_model)
    (directory / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False))
    (directory / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "zh"}))
    return directory


def train_marian(directory: Path, steps: int = 120) -> None:
    """A little teacher-forced training with Transformers itself, so that outputs differ from
    sentence to sentence and end at varied lengths (an untrained model repeats one token to the
    limit, which would let a wrong search pass by luck). The logits bias is Transformers' buffer,
    not trained: it stays random."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(directory)
    model = MarianMTModel.from_pretrained(directory)
    pairs = corpus_pairs(1500)[:1000]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        chosen = [pairs[i] for i in torch.randint(0, len(pairs), (32,), generator=generator).tolist()]
        batch = tokenizer(
            [f"{LANGUAGE_TOKENS[0]} {source}" for source, _ in chosen],
            text_target=[target for _, target in chosen],
            return_tensors="pt",
            padding=True,
        )
        labels = batch["labels"].masked_fill(batch["labels"] == model.config.pad_token_id, -100)
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(directory)


def source_only_pieces(directory: Path) -> list[str]:
    """The pieces of vocab.json that come from the source side: the source SentencePiece model has
    them and the target one lacks them (English words and parts of words, in this en-zh model)."""
    import sentencepiece as spm

    source = spm.SentencePieceProcessor(model_file=str(directory / "source.spm"))
    target = spm.SentencePieceProcessor(model_file=str(directory / "target.spm"))
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))

    def has(processor, piece: str) -> bool:
        return processor.piece_to_id(piece) != processor.unk_id()

    return [piece for piece in vocab if has(source, piece) and not has(target, piece)]


def favour_pieces(directory: Path, pieces: list[str], by: float) -> None:
    """Raise the logits bias of these pieces, so that the model writes them among its own: a name
    of the source copied into a Chinese translation, as OPUS-MT models do ("我 Tom Tom。")."""
    from safetensors.torch import load_file, save_file

    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    weights = load_file(directory / "model.safetensors")
    for piece in pieces:
        weights["final_logits_bias"][0, vocab[piece]] += by
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
