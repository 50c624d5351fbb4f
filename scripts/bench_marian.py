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

    python scripts/bench_marian.py --json bench_results/marian.json
    python scripts/bench_marian.py --repeats 1 --new-tokens 8       # a quick smoke test
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm
import torch
import transformers
from bench_decode import measure_alternating  # scripts/ is on sys.path when a script runs
from bench_machine import machine_info
from transformers import MarianConfig, MarianMTModel

from attn_cli.checkpoint import load_checkpoint
from attn_cli.data.builtin_corpora import corpus_file
from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_decode
from attn_cli.export.convert import export
from attn_cli.huggingface.importing import import_marian
from attn_cli.huggingface.marian import MarianIds, attn_rows
from attn_cli.vocab import EOS_ID, PAD_ID

MARIAN_SIZE = 65_001  # opus-mt-en-zh's vocabulary, its <pad> last
SHAPE = dict(d_model=512, layers=6, heads=8, ffn_dim=2048)
MODES = {"greedy": 1, "beam 5": 5}


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


def build_opus_shaped(directory: Path) -> None:
    """A random MarianMTModel with opus-mt-en-zh's config and tokenizer files of its layout."""
    english, chinese = corpus_sentences()
    source, target = sentencepiece(english, 8000), sentencepiece(chinese, 8000)
    pieces = ["</s>", "<unk>", ">>cmn_Hans<<", ">>yue_Hant<<"]
    seen = set(pieces)
    for proto in (source, target):
        processor = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if not processor.is_control(i) and not processor.is_unknown(i) and piece not in seen:
                pieces.append(piece)
                seen.add(piece)
    pieces += [f"▁filler{i}" for i in range(MARIAN_SIZE - 1 - len(pieces))] + ["<pad>"]
    config = MarianConfig(
        vocab_size=MARIAN_SIZE,
        decoder_vocab_size=MARIAN_SIZE,
        d_model=SHAPE["d_model"],
        encoder_layers=SHAPE["layers"],
        decoder_layers=SHAPE["layers"],
        encoder_attention_heads=SHAPE["heads"],
        decoder_attention_heads=SHAPE["heads"],
        encoder_ffn_dim=SHAPE["ffn_dim"],
        decoder_ffn_dim=SHAPE["ffn_dim"],
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=MARIAN_SIZE - 1,
        eos_token_id=0,
        decoder_start_token_id=MARIAN_SIZE - 1,
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
            return greedy_decode(self.model, src, exact_steps=self.new_tokens)
        found = beam_search(
            self.model, src, beam_size=beam_size, alpha=0.0, max_len_a=1.5, max_len_b=10, exact_steps=self.new_tokens
        )
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the models are built (default: a temporary one)"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import ctranslate2

    torch.set_num_threads(args.threads)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-marian-"))
    marian_dir, run_dir, ct2_dirs = workdir / "opus-mt-en-zh", workdir / "run", {}
    if not marian_dir.is_dir():
        build_opus_shaped(marian_dir)
    if not run_dir.is_dir():
        import_marian(str(marian_dir), run_dir, source_prefix=">>cmn_Hans<<", src_lang="en", tgt_lang="zh")
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    for quantization in ("int8", "float32"):
        ct2_dirs[quantization] = workdir / f"ct2-{quantization}"
        if not ct2_dirs[quantization].is_dir():
            export(checkpoint.config, checkpoint.tokenizers, checkpoint.model, ct2_dirs[quantization], quantization)

    english, _ = corpus_sentences()
    chosen = english[-4000::125][:32]  # 32 sentences spread over the longer end of the corpus
    ids = checkpoint.tokenizers.encode_sources(chosen)
    width = max(map(len, ids)) + 1
    src = torch.tensor([row + [EOS_ID] + [PAD_ID] * (width - len(row) - 1) for row in ids])
    to_marian = attn_rows(MARIAN_SIZE, MarianIds(eos=0, unk=1, pad=MARIAN_SIZE - 1, decoder_start=MARIAN_SIZE - 1))
    hf_model = MarianMTModel.from_pretrained(marian_dir).eval()
    pieces = checkpoint.tokenizers.source.vocabulary
    systems = {
        "attn (PyTorch)": Attn(checkpoint.model.eval(), args.new_tokens),
        "attn export, CTranslate2 int8": CTranslate2(
            ctranslate2.Translator(str(ct2_dirs["int8"]), intra_threads=args.threads), pieces, args.new_tokens
        ),
        "attn export, CTranslate2 float32": CTranslate2(
            ctranslate2.Translator(str(ct2_dirs["float32"]), intra_threads=args.threads), pieces, args.new_tokens
        ),
        "Transformers generate": Transformers(hf_model, to_marian, args.new_tokens),
    }
    ours = systems["attn (PyTorch)"].decode(src, 1)
    theirs = systems["Transformers generate"].decode(systems["Transformers generate"].prepare(src), 1)
    same = sum([to_marian[t] for t in a] == b for a, b in zip(ours, theirs))
    print(f"forced greedy outputs identical to Transformers': {same} of {len(ours)}", flush=True)

    rows = []
    for mode, beam in MODES.items():
        for batch in (1, 32):
            results = measure_alternating(systems, src[:batch], beam, args.new_tokens, args.repeats)
            for name, result in results.items():
                row = {"mode": mode, "batch": batch, "system": name, **result}
                row["sentences_per_s"] = batch / result["median_s"] if "median_s" in result else None
                rows.append(row)
                print(f"{mode:7} batch {batch:2}  {name:34} {row['sentences_per_s'] or 0:8.2f} sentences/s", flush=True)
    print()
    print(
        "| decoding | batch | attn (PyTorch) | CTranslate2 int8 | CTranslate2 float32 | Transformers "
        "| attn / Transformers | int8 / Transformers |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        for batch in (1, 32):
            speed = {r["system"]: r["sentences_per_s"] for r in rows if r["mode"] == mode and r["batch"] == batch}
            hf_speed = speed["Transformers generate"]
            attn, int8 = speed["attn (PyTorch)"], speed["attn export, CTranslate2 int8"]
            print(
                f"| {mode} | {batch} | {attn:.2f} | {int8:.2f} | {speed['attn export, CTranslate2 float32']:.2f} | "
                f"{hf_speed:.2f} | {attn / hf_speed:.2f}× | {int8 / hf_speed:.2f}× |"
            )
    sizes = {
        "marian_safetensors_mb": (marian_dir / "model.safetensors").stat().st_size / 1e6,
        "attn_checkpoint_mb": (run_dir / "checkpoints" / "best.pt").stat().st_size / 1e6,
        "ct2_int8_mb": (ct2_dirs["int8"] / "model.bin").stat().st_size / 1e6,
        "ct2_float32_mb": (ct2_dirs["float32"] / "model.bin").stat().st_size / 1e6,
    }
    print("sizes (MB): " + ", ".join(f"{k} {v:.1f}" for k, v in sizes.items()))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": machine_info(),
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "versions": {
                        "torch": torch.__version__,
                        "transformers": transformers.__version__,
                        "ctranslate2": ctranslate2.__version__,
                    },
                    "greedy_identical": same,
                    "sentences": len(chosen),
                    "sizes": sizes,
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    sys.exit(main())
