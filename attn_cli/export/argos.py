"""A checkpoint as an Argos Translate package (.argosmodel), which LibreTranslate serves once installed.

The package is a zip archive of one directory, translate-FROM_TO-1_0/, that Argos Translate
unpacks into its packages directory:

- metadata.json: the two languages, as Argos codes (ISO 639-1; `zt` for traditional Chinese, `pb`
  for Brazilian Portuguese) and English names, and the package's version;
- model/: the CTranslate2 model, as `attn export` writes it (so `attn translate --model` reads it too);
- sentencepiece.model: the SentencePiece model Argos encodes each sentence with and decodes each
  translation with. Argos takes one for both languages: the tokenizer must be joint;
- minisbd/FROM.onnx: the sentence splitter Argos Translate (1.11 and later) runs before
  translating, attn's rule (`sentence_splitter`), so that nothing is downloaded;
- README.md: what the package holds and the data it was trained on, with its attribution when the
  corpus is one of attn's built-in ones.

Argos searches with its own settings, not attn's: beam 4 (ARGOS_BEAM_SIZE), CTranslate2's length
penalty 0.2, at most 256 tokens, at least one, and the compute type CTranslate2 finds fastest.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from pathlib import Path

from attn_cli import languages
from attn_cli.config import Config, CorpusConfig
from attn_cli.data.builtin_corpora import BUILTIN_PREFIX, corpus_readme
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.engines.ctranslate2 import ExportError
from attn_cli.export.convert import export
from attn_cli.export.sentence_splitter import minisbd_model
from attn_cli.files import written_whole
from attn_cli.model import Transformer

SUFFIX = ".argosmodel"
PACKAGE_VERSION = "1.0"
ARGOS_VERSION = "1.11"  # the first to read a package's own sentence splitter (minisbd/)
# Argos's codes for the variants it tells apart, and their names.
_VARIANT_NAMES = {"zt": "Chinese (traditional)", "pb": "Portuguese (Brazil)"}


def export_argos(config: Config, tokenizers: Tokenizers, model: Transformer, output: Path, quantization: str) -> None:
    """Write the model as an Argos Translate package at `output` (a new FILE.argosmodel), whole or
    not at all: the CTranslate2 model is built beside it, and the archive takes its name complete."""
    if not output.name.endswith(SUFFIX) or output.is_dir():
        raise ExportError(f"--output {output} is not an {SUFFIX} file; name one, e.g. --output en_zh{SUFFIX}")
    if output.exists():
        raise ExportError(f"{output} already exists; give a new --output")
    if tokenizers.source is not tokenizers.target:
        raise ExportError(
            "an Argos Translate package holds one SentencePiece model for both languages, and this model "
            "has two (tokenizer.joint=false, or imported with two); train it with tokenizer.joint=true to "
            "export it to Argos"
        )
    if tokenizers.source_prefix is not None or tokenizers.source.vocabulary is not None:
        raise ExportError(
            "Argos Translate tokenizes with SentencePiece's own ids and puts no token before the source, and this "
            "model needs its own vocabulary or tokenizer.source_prefix; export it with --format ctranslate2 instead"
        )
    if len(config.data.directions) > 1:
        raise ExportError(
            f"an Argos Translate package translates one direction, and this model translates "
            f"{', '.join(map(str, config.data.directions))}; export it with --format ctranslate2 or huggingface"
        )
    source, target = argos_code(config.data.src_lang), argos_code(config.data.tgt_lang)
    top = f"translate-{source}_{target}-{PACKAGE_VERSION.replace('.', '_')}"
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{output.name}.", dir=output.parent) as building:
        model_dir = Path(building) / "model"
        export(config, tokenizers, model, model_dir, quantization)
        with written_whole(output, binary=True) as handle, zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as zipped:
            for file in sorted(path for path in model_dir.rglob("*") if path.is_file()):
                zipped.write(file, f"{top}/model/{file.relative_to(model_dir).as_posix()}")
            zipped.writestr(f"{top}/sentencepiece.model", tokenizers.source.model_proto)
            zipped.writestr(f"{top}/minisbd/{source}.onnx", minisbd_model(source))
            zipped.writestr(f"{top}/metadata.json", json.dumps(metadata(config), indent=2, ensure_ascii=False) + "\n")
            zipped.writestr(f"{top}/README.md", readme(config, tokenizers, quantization))


def argos_code(code: str) -> str:
    """The Argos Translate code of a language code: its primary subtag ("en-US": "en"), but `zt`
    for traditional Chinese (zh-Hant, zh-TW, zh-HK, zh-MO) and `pb` for Brazilian Portuguese (pt-BR)."""
    primary = languages.primary_subtag(code)
    subtags = code.replace("_", "-").lower().split("-")[1:]
    if primary == "zh" and "hans" not in subtags and ({"hant", "tw", "hk", "mo"} & set(subtags)):
        return "zt"
    if primary == "pt" and "br" in subtags:
        return "pb"
    return primary


def language_name(code: str) -> str:
    argos = argos_code(code)
    return _VARIANT_NAMES.get(argos) or languages.name(argos)


def metadata(config: Config) -> dict:
    """The package's metadata.json: what Argos Translate lists and looks packages up by."""
    source, target = config.data.src_lang, config.data.tgt_lang
    return {
        "package_version": PACKAGE_VERSION,
        "argos_version": ARGOS_VERSION,
        "type": "translate",
        "from_code": argos_code(source),
        "from_name": language_name(source),
        "to_code": argos_code(target),
        "to_name": language_name(target),
        "links": [],
    }


def readme(config: Config, tokenizers: Tokenizers, quantization: str) -> str:
    source, target = language_name(config.data.src_lang), language_name(config.data.tgt_lang)
    m = config.model
    lines = [
        f"# {source} → {target}",
        "",
        "A Transformer translation model trained with attn and exported with `attn export --format argos`.",
        "",
        f"- `model/`: the model for CTranslate2 ({quantization} weights): {m.encoder_layers} + {m.decoder_layers} "
        f"layers (encoder + decoder) of width {m.d_model}, {m.num_heads} attention heads.",
        f"- `sentencepiece.model`: its tokenizer, one SentencePiece model of {tokenizers.source.vocab_size:,} "
        "pieces for both languages.",
        "- `minisbd/`: the sentence splitter, a rule: a sentence ends after 。！？, and after . ! ? … "
        "followed by a space. Nothing is downloaded.",
        "",
        "## Training data",
        "",
    ]
    for corpus in config.data.training_corpora:
        attribution = corpus_readme(corpus.path) if corpus.path else None
        if attribution is not None:
            name = corpus.path[len(BUILTIN_PREFIX) :]
            lines += [f"attn's built-in corpus `{name}`:", "", _demoted(attribution)]
        else:
            lines += [
                f"{_described(corpus)}. attn's config records no licence for it: add the data's attribution "
                "here before you share this package.",
                "",
            ]
    return "\n".join(lines)


def _described(corpus: CorpusConfig) -> str:
    if corpus.format == "text":
        return f"The aligned files {corpus.src_path} and {corpus.tgt_path}"
    if corpus.format == "hf":
        if corpus.hf_name:
            return f"The Hugging Face dataset {corpus.hf_name} ({corpus.hf_config or 'default'}, {corpus.hf_split})"
        return f"The saved dataset {corpus.path}"
    return f"The {corpus.format.upper()} file {corpus.path}"


def _demoted(markdown: str) -> str:
    """`markdown` with each heading two levels down, to sit under this README's own."""
    return "\n".join("##" + line if line.startswith("#") else line for line in markdown.splitlines()) + "\n"
