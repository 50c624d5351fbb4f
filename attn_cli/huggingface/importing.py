"""`attn import hf`: a Hugging Face Marian checkpoint (an OPUS-MT model) as an attn run directory.

The directory is what `save_pretrained` or a Hub download leaves: config.json, model.safetensors or
pytorch_model.bin, source.spm, target.spm, vocab.json and tokenizer_config.json. Weights are read
without running code from the files: safetensors, or torch.load(weights_only=True). The run that
comes out holds config.yaml, tokenizer/ and checkpoints/best.pt, like a trained one: translate,
eval, export, serve and doctor take it with --run, and train.init_from fine-tunes it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Optional

import torch

from attn_cli.checkpoint import save_checkpoint
from attn_cli.config import Config, CorpusConfig, DataConfig, TokenizerConfig, config_to_yaml
from attn_cli.data.tokenizer import SPECIAL_PIECES, Tokenizer, Tokenizers
from attn_cli.errors import UserError
from attn_cli.files import directory_built_whole, require_new_directory, write_whole
from attn_cli.huggingface.marian import MarianError, MarianIds, attn_rows, attn_weights, model_config_of
from attn_cli.languages import primary_subtag
from attn_cli.model.positions import SinusoidalPositions
from attn_cli.model.transformer import build_model
from attn_cli.paths import RunPaths

NEEDED = ("config.json", "source.spm", "target.spm", "vocab.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# A multi-target model's target-language tokens, as its vocabulary spells them: >>cmn_Hans<<.
LANGUAGE_TOKEN = re.compile(r">>[^<>\s]+<<")


def import_marian(
    given: str,
    output: Path,
    source_prefix: Optional[str] = None,
    src_lang: Optional[str] = None,
    tgt_lang: Optional[str] = None,
    log: Callable[[str], None] = print,
) -> Config:
    """Write the run directory `output` (new, or empty) from the Marian model at `given`, a local
    directory or a Hub id; returns the run's config."""
    require_new_directory(output)
    directory = _local_directory(given, log)
    hf = _read_json(directory / "config.json")
    vocab = _read_json(directory / "vocab.json")
    settings = (
        _read_json(directory / "tokenizer_config.json") if (directory / "tokenizer_config.json").is_file() else {}
    )
    if settings.get("separate_vocabs"):
        raise MarianError(f"{directory} has separate source and target vocabularies; attn imports shared ones")
    if "<unk>" not in vocab:
        raise MarianError(f"{directory / 'vocab.json'} has no <unk>; is it a Marian vocabulary?")
    try:
        model_cfg = model_config_of(hf)
        marian_size, pad = hf["vocab_size"], hf["pad_token_id"]
        ids = MarianIds(
            eos=hf["eos_token_id"], unk=vocab["<unk>"], pad=pad, decoder_start=hf.get("decoder_start_token_id", pad)
        )
    except KeyError as missing:
        raise MarianError(f"{directory / 'config.json'} has no {missing}; is it a MarianMTModel's config?") from None
    pieces = _pieces_by_id(vocab, marian_size, directory / "vocab.json")
    rows = attn_rows(marian_size, ids)
    vocabulary = list(SPECIAL_PIECES) + [pieces[row] for row in rows[len(SPECIAL_PIECES) :]]
    source_prefix = _source_prefix(vocabulary, source_prefix, directory)
    tokenizers = Tokenizers(
        Tokenizer((directory / "source.spm").read_bytes(), str(directory / "source.spm"), vocabulary),
        Tokenizer((directory / "target.spm").read_bytes(), str(directory / "target.spm"), vocabulary),
        source_prefix,
    )
    src_lang, tgt_lang = _languages(given, settings, src_lang, tgt_lang)
    # The corpus a fine-tuning run reads unless told another (--set data.corpus.path=...): the
    # built-in one where it is the pair's.
    builtin = (primary_subtag(src_lang), primary_subtag(tgt_lang)) == ("en", "zh")
    corpus = CorpusConfig(path="builtin:tatoeba-cmn-eng" if builtin else "corpus.tsv")
    config = Config(
        run_dir=str(output),
        data=DataConfig(corpus=corpus, src_lang=src_lang, tgt_lang=tgt_lang),
        tokenizer=TokenizerConfig(vocab_size=len(vocabulary), joint=True, source_prefix=source_prefix),
        model=model_cfg,
    )
    config.validate()
    marian = _read_weights(directory)
    _check_positions(marian, model_cfg.d_model)
    model = build_model(model_cfg, len(vocabulary), len(vocabulary))
    try:
        model.load_state_dict(attn_weights(marian, model_cfg, ids, marian_size))
    except RuntimeError as error:  # a weight of another shape than config.json says
        details = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise MarianError(f"the weights do not fit {directory / 'config.json'}: {details[-1]}") from None
    with directory_built_whole(output) as building:
        built = RunPaths.of(building)
        write_whole(built.config, config_to_yaml(config))
        tokenizers.save(built.tokenizer_dir)
        save_checkpoint(built.best_checkpoint, config, tokenizers, model, step=0, epoch=0)
    log(
        f"imported {given}: {model_cfg.encoder_layers}+{model_cfg.decoder_layers} layers, d_model {model_cfg.d_model}, "
        f"{len(vocabulary):,} pieces" + (f", source prefix {source_prefix}" if source_prefix else "") + f" -> {output}"
    )
    return config


def _local_directory(given: str, log: Callable[[str], None]) -> Path:
    path = Path(given)
    if path.is_dir():
        missing = [name for name in NEEDED if not (path / name).is_file()]
        if not any((path / name).is_file() for name in WEIGHT_FILES):
            missing.append(" or ".join(WEIGHT_FILES))
        if missing:
            raise UserError(
                f"{path} lacks {', '.join(missing)}; give the directory save_pretrained or a Hub download wrote"
            )
        return path
    if path.exists() or given.count("/") != 1 or given.startswith((".", "/")):
        raise UserError(
            f"{given} is not a directory; give a Marian model's directory or a Hub id "
            f"such as Helsinki-NLP/opus-mt-en-zh"
        )
    return _download(given, log)


def _download(repo_id: str, log: Callable[[str], None]) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError('fetching from the Hub needs huggingface_hub: pip install "attn-cli[hf]"') from None
    log(f"fetching {repo_id} from the Hugging Face Hub")
    try:
        return Path(
            snapshot_download(
                repo_id, allow_patterns=[*NEEDED, "tokenizer_config.json", "generation_config.json", *WEIGHT_FILES]
            )
        )
    except Exception as error:  # offline, unknown id, no permission: one line either way
        raise UserError(
            f"could not fetch {repo_id} from the Hugging Face Hub ({type(error).__name__}); offline, download it on a "
            f"machine that is online (huggingface-cli download {repo_id} --local-dir DIR) and import DIR"
        ) from None


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"cannot read {path}: {error}") from None


def _pieces_by_id(vocab: dict, size: int, path: Path) -> list[str]:
    """vocab.json (piece -> id) as a list by id, every id of 0..size-1 named once."""
    pieces: list[Optional[str]] = [None] * size
    for piece, index in vocab.items():
        if not isinstance(index, int) or not 0 <= index < size or pieces[index] is not None:
            raise MarianError(f"{path}: {piece!r} has id {index!r}, outside 0..{size - 1} or taken twice")
        pieces[index] = piece
    if None in pieces:
        raise MarianError(f"{path} names {len(vocab):,} ids, and config.json's vocab_size is {size:,}")
    return pieces  # type: ignore[return-value]


def _source_prefix(vocabulary: list[str], given: Optional[str], directory: Path) -> Optional[str]:
    """The language token every source needs: a multi-target model has them, and one must be chosen."""
    tokens = [piece for piece in vocabulary if LANGUAGE_TOKEN.fullmatch(piece)]
    if given is None and tokens:
        shown = ", ".join(tokens[:6]) + (", ..." if len(tokens) > 6 else "")
        raise UserError(
            f"{directory} is a multi-target model: each source starts with the target language's token "
            f"({shown}); choose one with --source-prefix, e.g. --source-prefix '{tokens[0]}'"
        )
    if given is not None and given not in vocabulary:
        raise UserError(
            f"--source-prefix {given!r} is not in {directory / 'vocab.json'}; "
            f"its language tokens: {', '.join(tokens) or 'none'}"
        )
    return given


def _languages(given: str, settings: dict, src_lang: Optional[str], tgt_lang: Optional[str]) -> tuple[str, str]:
    """The pair's codes: as given, else from an OPUS-MT name (opus-mt-en-zh), else tokenizer_config.json."""
    named = re.search(r"opus-mt-([a-z]+)-([a-z]+)$", given.rstrip("/"))
    src = src_lang or (named.group(1) if named else settings.get("source_lang"))
    tgt = tgt_lang or (named.group(2) if named else settings.get("target_lang"))
    if not src or not tgt:
        raise UserError("the model does not say its languages; give them with --src-lang and --tgt-lang (e.g. en, zh)")
    return src, tgt


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The weights, read without running code from the file; a damaged file is one line."""
    if (directory / "model.safetensors").is_file():
        path = directory / "model.safetensors"
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise UserError('reading model.safetensors needs safetensors: pip install "attn-cli[hf]"') from None
        reader = load_file
    else:
        path = directory / "pytorch_model.bin"

        def reader(file):
            return torch.load(file, map_location="cpu", weights_only=True)

    try:
        return reader(path)
    except Exception as error:  # damaged, truncated, or a pickle that holds more than tensors
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"cannot read the weights in {path}: {first_line}") from None


def _check_positions(marian: dict[str, torch.Tensor], d_model: int) -> None:
    """A checkpoint that stores its position table (older Transformers did) must hold Marian's sinusoids."""
    for name, table in marian.items():
        if name.endswith("embed_positions.weight"):
            expected = SinusoidalPositions(d_model, table.shape[0], "halves")(0, table.shape[0])
            if not torch.allclose(table.float(), expected, atol=1e-4):
                raise MarianError(f"{name} is not Marian's sinusoidal table; attn cannot represent it exactly")
