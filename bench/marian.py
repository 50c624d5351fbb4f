"""An imported Marian model of opus-mt-en-zh's shape, decoded by attn, by its CTranslate2 export and by
Transformers' `generate`, side by side in one run.

The model: a MarianMTModel with opus-mt-en-zh's config (6+6 layers, d_model 512, 8 heads,
feed-forward 2048, SiLU, 65,001 pieces), random weights (the real ones need the Hub), saved with
save_pretrained and imported with attn's own `import_marian`; the CTranslate2 model is
`attn export` of the imported run (int8 and float32). Every system decodes the same 32 English test
sentences, tokenized once, and is forced to produce exactly --new-tokens tokens per sentence (EOS
suppressed), so that all do the same number of decoder steps: greedy and beam 5, one sentence and
32 at a time. Prints a table of median sentences/s and writes it as JSON. Before timing, checks
that attn's and Transformers' forced greedy outputs are the same tokens (the import is exact).
Timings alternate system by system, round after round (`measure_alternating` of bench/decode.py).
Without CTranslate2, its two systems are reported as unavailable.

    python3 -m bench.marian --json bench_results/marian.json
    python3 -m bench.marian --repeats 1 --new-tokens 8       # a quicker run
    python3 -m bench.marian --smoke --json /tmp/marian.json  # a tiny model of the same layout: checks that it runs
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm
import torch
import transformers
from transformers import MarianConfig, MarianMTModel

from attn_cli.checkpoint import load_checkpoint
from attn_cli.data.builtin_corpora import corpus_file
from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_search
from attn_cli.decoding.search import SearchSettings
from attn_cli.export.convert import export
from attn_cli.huggingface.importing import import_marian
from attn_cli.huggingface.marian import MarianIds, attn_rows
from attn_cli.vocab import EOS_ID, PAD_ID
from bench.decode import measure_alternating
from bench.toolkit import markdown_table, parser, ratio, write_report

MARIAN_SIZE = 65_001  # opus-mt-en-zh's vocabulary, its <pad> last
SHAPE = dict(d_model=512, layers=6, heads=8, ffn_dim=2048)
MODES = {"greedy": 1, "beam 5": 5}
BATCHES = (1, 32)
# --smoke: a model of the same layout, small enough to build, import and export in seconds; its
# SentencePiece models are trained on the corpus's first (shortest) pairs.
SMOKE = dict(
    marian_size=4001, shape=dict(d_model=64, layers=1, heads=2, ffn_dim=128), spm_sentences=2000, spm_vocab=1500
)
SMOKE_BATCHES = (1, 4)


def corpus_sentences() -> tuple[list[str], list[str]]:
    """The built-in corpus's English and Chinese sides, ordered by length as the file is."""
    import lzma

    with lzma.open(corpus_file("builtin:tatoeba-cmn-eng"), "rt", encoding="utf-8") as lines:
        pairs = [line.split("\t")[:2] for line in lines if "\t" in line]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def sentencepiece(sentences: list[str], vocab_size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        character_coverage=0.9995,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return model.getvalue()


def build_opus_shaped(
    directory: Path,
    marian_size: int = MARIAN_SIZE,
    shape: dict = SHAPE,
    spm_sentences: int | None = None,
    spm_vocab: int = 8000,
) -> None:
    """A random MarianMTModel with opus-mt-en-zh's config and tokenizer files of its layout (of
    another size and shape when asked: --smoke)."""
    english, chinese = corpus_sentences()
    source = sentencepiece(english[:spm_sentences], spm_vocab)
    target = sentencepiece(chinese[:spm_sentences], spm_vocab)
    pieces = ["</s>", "<unk>", ">>cmn_Hans<<", ">>yue_Hant<<"]
    seen = set(pieces)
    for proto in (source, target):
        processor = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if not processor.is_control(i) and not processor.is_unknown(i) and piece not in seen:
                pieces.append(piece)
                seen.add(piece)
    if len(pieces) > marian_size - 1:
        raise ValueError(f"{len(pieces)} pieces do not fit a vocabulary of {marian_size}")
    pieces += [f"▁filler{i}" for i in range(marian_size - 1 - len(pieces))] + ["<pad>"]
    config = MarianConfig(
        vocab_size=marian_size,
        decoder_vocab_size=marian_size,
        d_model=shape["d_model"],
        encoder_layers=shape["layers"],
        decoder_layers=shape["layers"],
        encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn_dim"],
        decoder_ffn_dim=shape["ffn_dim"],
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=marian_size - 1,
        eos_token_id=0,
        decoder_start_token_id=marian_size - 1,
        forced_eos_token_id=0,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    MarianMTModel(config).save_pretrained(directory)
    (directory / "source.spm").write_bytes(source)
    (directory / "target.spm").write_bytes(target)
    (directory / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False))
    (directory / "tokenizer_config.json").write_text(json.dumps({"source_lang": "eng", "target_lang": "zho"}))


class Attn:
    eos = EOS_ID

    def __init__(self, model, new_tokens: int):
        self.model, self.new_tokens = model, new_tokens

    def prepare(self, src: torch.Tensor) -> torch.Tensor:
        return src

    @torch.inference_mode()
    def decode(self, src: torch.Tensor, beam_size: int):
        if beam_size == 1:
            found = greedy_search(self.model, src, SearchSettings(exact_steps=self.new_tokens), scored=False)
        else:
            settings = SearchSettings(
                beam_size=beam_size, length_penalty=0.0, max_len_a=1.5, max_len_b=10, exact_steps=self.new_tokens
            )
            found = beam_search(self.model, src, settings)
        return [hypotheses[0].tokens for hypotheses in found]


class Transformers:
    """`generate` with the forced length; the source in Marian's ids, padded with its padding."""

    eos = 0

    def __init__(self, model: MarianMTModel, to_marian: list, new_tokens: int):
        self.model, self.to_marian, self.new_tokens = model, to_marian, new_tokens

    def prepare(self, src: torch.Tensor) -> torch.Tensor:
        pad = self.model.config.pad_token_id
        mapped = [[self.to_marian[i] if i != PAD_ID else pad for i in row] for row in src.tolist()]
        return torch.tensor(mapped)

    @torch.inference_mode()
    def decode(self, src: torch.Tensor, beam_size: int):
        out = self.model.generate(
            input_ids=src,
            attention_mask=src != self.model.config.pad_token_id,
            num_beams=beam_size,
            do_sample=False,
            min_new_tokens=self.new_tokens,
            max_new_tokens=self.new_tokens,
            forced_eos_token_id=None,  # the config's forced end of sentence would take the last step
        )
        return out[:, 1:].tolist()


class CTranslate2:
    eos = "</s>"

    def __init__(self, translator, pieces: list[str], new_tokens: int):
        self.translator, self.pieces, self.new_tokens = translator, pieces, new_tokens

    def prepare(self, src: torch.Tensor) -> list[list[str]]:
        # attn's export adds the source EOS itself
        return [[self.pieces[i] for i in row if i not in (PAD_ID, EOS_ID)] for row in src.tolist()]

    def decode(self, tokens: list[list[str]], beam_size: int):
        results = self.translator.translate_batch(
            tokens, beam_size=beam_size, min_decoding_length=self.new_tokens, max_decoding_length=self.new_tokens
        )
        return [result.hypotheses[0] for result in results]


def main() -> None:
    arguments = parser(
        __doc__,
        "a model of the same layout but d_model 64, 1+1 layers and 4,001 pieces, batches of 1 and 4, "
        "4 new tokens, one timed run, one thread",
    )
    arguments.add_argument("--new-tokens", type=int, default=24)
    arguments.add_argument("--repeats", type=int, default=3)
    arguments.add_argument("--threads", type=int, default=2)
    arguments.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the models are built, and found again by a later run (default: a new temporary directory)",
    )
    args = arguments.parse_args()
    size = {}
    batches = BATCHES
    if args.smoke:
        args.new_tokens, args.repeats, args.threads = 4, 1, 1
        size, batches = SMOKE, SMOKE_BATCHES
    try:
        import ctranslate2
    except ImportError as error:
        ctranslate2, ct2_missing = None, f"ctranslate2 does not import: {error}"

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-marian-"))
    if args.smoke:
        workdir = workdir / "marian-smoke"  # never the full-size models of an earlier run
    marian_dir, run_dir, ct2_dirs = workdir / "opus-mt-en-zh", workdir / "run", {}
    if not marian_dir.is_dir():
        build_opus_shaped(marian_dir, **size)
    if not run_dir.is_dir():
        import_marian(str(marian_dir), run_dir, source_prefix=">>cmn_Hans<<", src_lang="en", tgt_lang="zh")
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    for quantization in ("int8", "float32") if ctranslate2 else ():
        ct2_dirs[quantization] = workdir / f"ct2-{quantization}"
        if not ct2_dirs[quantization].is_dir():
            export(checkpoint.config, checkpoint.tokenizers, checkpoint.model, ct2_dirs[quantization], quantization)

    english, _ = corpus_sentences()
    chosen = english[-4000::125][: max(batches)]  # sentences spread over the longer end of the corpus
    ids = checkpoint.tokenizers.encode_sources(chosen)
    width = max(map(len, ids)) + 1
    src = torch.tensor([row + [EOS_ID] + [PAD_ID] * (width - len(row) - 1) for row in ids])
    marian_size = size.get("marian_size", MARIAN_SIZE)
    to_marian = attn_rows(marian_size, MarianIds(eos=0, unk=1, pad=marian_size - 1, decoder_start=marian_size - 1))
    hf_model = MarianMTModel.from_pretrained(marian_dir).eval()
    pieces = checkpoint.tokenizers.source.vocabulary

    def ct2_system(quantization: str):
        if ctranslate2 is None:
            return ct2_missing
        translator = ctranslate2.Translator(str(ct2_dirs[quantization]), intra_threads=args.threads)
        return CTranslate2(translator, pieces, args.new_tokens)

    systems = {
        "attn (PyTorch)": Attn(checkpoint.model.eval(), args.new_tokens),
        "attn export, CTranslate2 int8": ct2_system("int8"),
        "attn export, CTranslate2 float32": ct2_system("float32"),
        "Transformers generate": Transformers(hf_model, to_marian, args.new_tokens),
    }
    ours = systems["attn (PyTorch)"].decode(src, 1)
    theirs = systems["Transformers generate"].decode(systems["Transformers generate"].prepare(src), 1)
    same = sum([to_marian[t] for t in a] == b for a, b in zip(ours, theirs))
    print(f"forced greedy outputs identical to Transformers': {same} of {len(ours)}", flush=True)

    rows = []
    for mode, beam in MODES.items():
        for batch in batches:
            results = measure_alternating(systems, src[:batch], beam, args.new_tokens, args.repeats)
            for name, result in results.items():
                row = {"mode": mode, "batch": batch, "system": name, **result}
                row["sentences_per_s"] = batch / result["median_s"] if "median_s" in result else None
                rows.append(row)
                speed = f"{row['sentences_per_s']:8.2f} sentences/s" if "median_s" in result else result["error"]
                print(f"{mode:7} batch {batch:2}  {name:34} {speed}", flush=True)
    print()
    table = []
    for mode in MODES:
        for batch in batches:
            speed = {r["system"]: r["sentences_per_s"] for r in rows if r["mode"] == mode and r["batch"] == batch}
            hf_speed = speed["Transformers generate"]
            attn, int8 = speed["attn (PyTorch)"], speed["attn export, CTranslate2 int8"]
            float32 = speed["attn export, CTranslate2 float32"]
            cells = (attn, int8, float32, hf_speed, ratio(attn, hf_speed), ratio(int8, hf_speed))
            table.append([mode, batch, *(None if value is None else round(value, 2) for value in cells)])
    headers = [
        "decoding",
        "batch",
        "attn (PyTorch)",
        "CTranslate2 int8",
        "CTranslate2 float32",
        "Transformers",
        "attn / Transformers ×",
        "int8 / Transformers ×",
    ]
    print(markdown_table(headers, table))
    if ctranslate2 is None:
        print(f"CTranslate2: n/a ({ct2_missing})")
    sizes = {
        "marian_safetensors_mb": (marian_dir / "model.safetensors").stat().st_size / 1e6,
        "attn_checkpoint_mb": (run_dir / "checkpoints" / "best.pt").stat().st_size / 1e6,
        **{f"ct2_{q}_mb": (directory / "model.bin").stat().st_size / 1e6 for q, directory in ct2_dirs.items()},
    }
    print("sizes (MB): " + ", ".join(f"{k} {v:.1f}" for k, v in sizes.items()))
    results = {
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "ctranslate2": ctranslate2.__version__ if ctranslate2 else None,
        },
        "greedy_identical": same,
        "sentences": len(chosen),
        "sizes": sizes,
        "rows": rows,
    }
    write_report(args.json, results, args)


if __name__ == "__main__":
    sys.exit(main())
