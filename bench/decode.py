"""Decoding speed of our Transformer against Hugging Face Transformers (MarianMTModel) and CTranslate2.

Every system decodes the same random source ids with a randomly initialised model of the same
size (no checkpoint, no hub access) and is forced to produce exactly --new-tokens tokens per
sentence, EOS suppressed, so all do the same number of decoder steps. The CTranslate2 models are
converted from the Transformers one, to float32 and to int8 (on a GPU, --device cuda: float16
and int8_float16). Prints a table of median tokens/s and writes everything as JSON (by default
bench_results/decode.json). Needs `transformers`;
CTranslate2 is used where it imports, and reported as unavailable where it does not.

    python3 -m bench.decode                                   # both sizes, greedy and beam 5, batch 1 and 32
    python3 -m bench.decode --sizes small --batch-sizes 1 --repeats 1   # a quicker run
    python3 -m bench.decode --modes beam5 --batch-sizes 32 --json bench_results/beam.json
    python3 -m bench.decode --cache-ablation                  # also ours greedy without the KV cache
    python3 -m bench.decode --profile                         # where ours spends beam-5 batch-32 time
    python3 -m bench.decode --device cuda --batch-sizes 1 64  # on a GPU: CTranslate2 float16 and int8_float16
    python3 -m bench.decode --smoke --json /tmp/decode.json   # seconds: checks that it runs
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import MarianMTModel, PreTrainedTokenizerFast

from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_search
from attn_cli.decoding.search import SearchSettings
from attn_cli.model import Transformer
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from bench.toolkit import REPO, alternate, attn_model, marian_like, markdown_table, median, parser, ratio, write_report

try:
    import ctranslate2

    CT2_MISSING = ""
except ImportError as error:
    ctranslate2 = None
    CT2_MISSING = f"ctranslate2 does not import: {error}"

VOCAB = 8000
SIZES = {
    "small": {"d_model": 256, "num_heads": 4, "ffn_dim": 1024, "layers": 3},
    "base": {"d_model": 512, "num_heads": 8, "ffn_dim": 2048, "layers": 6},
}
BEAM_SIZES = {"greedy": 1, "beam5": 5}
# CTranslate2's weight types timed on each device; the first is the one ours is compared with.
CT2_QUANTIZATIONS = {"cpu": ("float32", "int8"), "cuda": ("float16", "int8_float16")}

# Token strings, for CTranslate2, which reads and writes strings. Its Marian converter takes the
# last token for the "<pad>" that Transformers appends to Marian vocabularies and drops it along
# with its embedding row, so our last id is named "<pad>" (CTranslate2's output layer thus has
# 7,999 rows, 0.01% less work), our padding id 0 "<blank>", and sources never use the last id.
TOKENS = ["<blank>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, VOCAB - 1)] + ["<pad>"]

# A system's outputs: one token sequence per sentence (ids, or strings for CTranslate2).
Outputs = list[list[int | str]]


class Unavailable(Exception):
    """A case a system cannot run here; the table shows n/a and the reason."""


# --- the three systems: prepare(src) once per case (untimed), then decode(inputs, beam_size) (timed)


class Ours:
    eos = EOS_ID

    def __init__(self, model: Transformer, new_tokens: int, use_cache: bool = True):
        self.model, self.new_tokens, self.use_cache = model, new_tokens, use_cache

    def prepare(self, src: torch.Tensor) -> torch.Tensor:
        return src.to(self.model.output_weight.device)

    def decode(self, src: torch.Tensor, beam_size: int) -> Outputs:
        if beam_size == 1:
            found = greedy_search(
                self.model, src, SearchSettings(exact_steps=self.new_tokens), use_cache=self.use_cache, scored=False
            )
            return [hypotheses[0].tokens for hypotheses in found]
        if not self.use_cache:
            raise Unavailable("greedy only")
        settings = SearchSettings(
            beam_size=beam_size, n_best=1, length_penalty=0.0, max_len_a=1.5, max_len_b=10, exact_steps=self.new_tokens
        )
        return [hypotheses[0].tokens for hypotheses in beam_search(self.model, src, settings)]


class HuggingFace:
    """`generate` with Transformers' defaults but the forced length: KV cache on, no scores or
    attentions returned, and for beam search length_penalty 1.0 and early_stopping False (neither
    matters when every hypothesis has the same length). The model's generation config adds no
    extra logits processors (see `build_marian`)."""

    eos = EOS_ID

    def __init__(self, model: MarianMTModel, new_tokens: int):
        self.model, self.new_tokens = model, new_tokens

    def prepare(self, src: torch.Tensor) -> torch.Tensor:
        return src.to(self.model.device)

    @torch.inference_mode()
    def decode(self, src: torch.Tensor, beam_size: int) -> Outputs:
        out = self.model.generate(
            input_ids=src,
            attention_mask=src != PAD_ID,
            num_beams=beam_size,
            do_sample=False,
            min_new_tokens=self.new_tokens,
            max_new_tokens=self.new_tokens,
        )
        # Each row is the decoder start token and the new tokens; a row that ended early would
        # hold an EOS, which `check_outputs` rejects.
        if not (out[:, 0] == BOS_ID).all():
            raise RuntimeError("Transformers output does not start with the decoder start token")
        return out[:, 1:].tolist()


class CTranslate2:
    """`translate_batch` with CTranslate2's defaults but the forced length (max_batch_size 0 and
    batch_type "examples": the whole batch at once). Its decoding lengths count the output tokens
    without EOS, so min = max = new_tokens yields exactly new_tokens tokens and no EOS."""

    eos = TOKENS[EOS_ID]

    def __init__(self, translator: ctranslate2.Translator, new_tokens: int):
        self.translator, self.new_tokens = translator, new_tokens

    def prepare(self, src: torch.Tensor) -> list[list[str]]:
        return [[TOKENS[i] for i in row] for row in src.tolist()]

    def decode(self, tokens: list[list[str]], beam_size: int) -> Outputs:
        results = self.translator.translate_batch(
            tokens, beam_size=beam_size, min_decoding_length=self.new_tokens, max_decoding_length=self.new_tokens
        )
        return [result.hypotheses[0] for result in results]


System = Ours | HuggingFace | CTranslate2


# --- models


def build_ours(size: str) -> Transformer:
    return attn_model(SIZES[size], VOCAB, dropout=0.0).eval()


def build_marian(size: str) -> MarianMTModel:
    model = marian_like(SIZES[size], VOCAB, dropout=0.0).eval()
    # CTranslate2 starts a Marian decoder from a zero embedding whatever the start token; with a
    # zero start-token row Transformers computes the same, so their outputs can be compared.
    with torch.no_grad():
        model.get_input_embeddings().weight[BOS_ID] = 0
    return model


def ctranslate2_system(
    hf_dir: Path, quantization: str, new_tokens: int, threads: int, workdir: Path, device: str = "cpu"
) -> System | str:
    """A CTranslate2 conversion of the saved Transformers model; the reason where it fails."""
    if ctranslate2 is None:
        return CT2_MISSING
    try:
        converter = ctranslate2.converters.TransformersConverter(str(hf_dir))
        model_dir = converter.convert(str(workdir / f"ct2_{quantization}_{threads}"), quantization=quantization)
        translator = ctranslate2.Translator(model_dir, device=device, intra_threads=threads, inter_threads=1)
    except Exception as error:  # noqa: BLE001 - whatever fails is reported in the table
        return f"conversion failed: {type(error).__name__}: {error}"
    try:  # a wheel built for another CUDA than the machine's fails at its first translation
        translator.translate_batch([[TOKENS[4], TOKENS[EOS_ID]]], max_decoding_length=1)
    except Exception as error:  # noqa: BLE001
        return f"cannot translate on {device}: {type(error).__name__}: {error}"
    return CTranslate2(translator, new_tokens)


def save_for_conversion(marian: MarianMTModel, directory: Path) -> None:
    """The model and a word-level tokenizer over TOKENS: the converter reads only the tokenizer's
    vocabulary and its EOS and UNK names, and a random model has no SentencePiece files."""
    marian.save_pretrained(directory)
    vocabulary = {token: index for index, token in enumerate(TOKENS)}
    tokenizer = Tokenizer(WordLevel(vocabulary, unk_token=TOKENS[UNK_ID]))
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token=TOKENS[UNK_ID], eos_token=TOKENS[EOS_ID]
    ).save_pretrained(directory)


# --- measuring


def random_sources(batch: int, length: int) -> torch.Tensor:
    """(batch, length) ids, the same for every system and run: ordinary tokens, then EOS."""
    src = torch.randint(4, VOCAB - 1, (batch, length), generator=torch.Generator().manual_seed(0))
    src[:, -1] = EOS_ID
    return src


def check_outputs(outputs: Outputs, batch: int, new_tokens: int, eos: int | str) -> None:
    lengths = sorted({len(row) for row in outputs})
    if len(outputs) != batch or lengths != [new_tokens] or any(eos in row for row in outputs):
        raise RuntimeError(
            f"expected {batch} outputs of exactly {new_tokens} tokens without EOS, "
            f"got {len(outputs)} of lengths {lengths}"
        )


def measure(system: System | str, src: torch.Tensor, beam_size: int, new_tokens: int, repeats: int) -> dict:
    """One verified warm-up, then `repeats` timed runs, each output verified after its timing."""
    return measure_alternating({"system": system}, src, beam_size, new_tokens, repeats)["system"]


def measure_alternating(
    systems: dict[str, System | str], src: torch.Tensor, beam_size: int, new_tokens: int, repeats: int
) -> dict[str, dict]:
    """Each system's verified warm-up, then `repeats` rounds that time every system once in turn
    (`toolkit.alternate`), so that a slow spell of the shared machine falls on all of them rather
    than on one. A system given as a string, or one whose warm-up raises `Unavailable`, is reported
    with that reason. Every system has `prepare(src)` (untimed), `decode(inputs, beam_size)` and `eos`."""
    results: dict[str, dict] = {}
    calls: dict[str, Callable[[], Outputs]] = {}
    for name, system in systems.items():
        if isinstance(system, str):
            results[name] = {"error": system}
            continue
        inputs = system.prepare(src)
        try:
            check_outputs(system.decode(inputs, beam_size), src.shape[0], new_tokens, system.eos)
        except Unavailable as reason:
            results[name] = {"error": str(reason)}
            continue
        calls[name] = lambda system=system, inputs=inputs: system.decode(inputs, beam_size)

    def check(name: str, outputs: Outputs) -> None:
        check_outputs(outputs, src.shape[0], new_tokens, systems[name].eos)

    for name, timings in alternate(calls, repeats, warmup=False, check=check).items():
        seconds = median(timings)
        results[name] = {
            "median_s": seconds,
            "tokens_per_s": src.shape[0] * new_tokens / seconds,
            "ms_per_sentence": 1000 * seconds / src.shape[0],
            "seconds": timings,
        }
    return {name: results[name] for name in systems}


def speed_ratio(results: dict, numerator: str, denominator: str) -> float | None:
    """How many times the tokens/s of one system the other's is; None if either did not run."""
    return ratio(results.get(numerator, {}).get("tokens_per_s"), results.get(denominator, {}).get("tokens_per_s"))


def ct2_agreement(hf: HuggingFace, ct2: System | str, src: torch.Tensor) -> float | None:
    """The share of greedy output tokens on which CTranslate2 float32 and Transformers agree: a
    check that the converted model computes the same function (rare near-ties may differ)."""
    if isinstance(ct2, str):
        return None
    hf_tokens = [[TOKENS[i] for i in row] for row in hf.decode(hf.prepare(src), 1)]
    ct2_tokens = ct2.decode(ct2.prepare(src), 1)
    pairs = [(a, b) for hf_row, ct2_row in zip(hf_tokens, ct2_tokens) for a, b in zip(hf_row, ct2_row)]
    return sum(a == b for a, b in pairs) / len(pairs)


def bench_size(size: str, args: argparse.Namespace) -> tuple[list[dict], dict]:
    """All cases of one size, and facts about its models.

    Ours and Transformers share torch's thread pool and are timed case by case, alternating run
    by run within a case (`measure_alternating`).
    CTranslate2's worker threads keep spinning after each call while their translator lives, which
    slows whatever runs next severalfold (measured here: our batch-1 greedy decoding from 630 to
    240 tokens/s), so each CTranslate2 model is built just before its cases and released after.
    CTranslate2 is timed with 1 and with --threads intra-op threads and reported at its best: on
    the 2-core development machine its 2-thread mode ran 3 to 6 times slower than 1 thread.
    """
    cases = [
        (mode, batch, random_sources(batch, args.source_length)) for mode in args.modes for batch in args.batch_sizes
    ]
    results: list[dict] = [{} for _ in cases]
    marian = build_marian(size)
    torch_systems: dict[str, System] = {
        "ours": Ours(build_ours(size).to(args.device), args.new_tokens),
        "hf": HuggingFace(marian.to(args.device), args.new_tokens),
    }
    if args.cache_ablation:
        torch_systems["ours_uncached"] = Ours(torch_systems["ours"].model, args.new_tokens, use_cache=False)
    for (mode, batch, src), case_results in zip(cases, results):
        case_results.update(measure_alternating(torch_systems, src, BEAM_SIZES[mode], args.new_tokens, args.repeats))
        for name in torch_systems:
            report(size, mode, batch, name, case_results[name])
    info = {**SIZES[size], "ct2_compute_types": {}, "ct2_float32_greedy_agreement_with_hf": None}
    args.workdir.mkdir(parents=True, exist_ok=True)
    quantizations = CT2_QUANTIZATIONS[args.device]
    thread_counts = sorted({1, args.threads}) if args.device == "cpu" else [1]  # a GPU decodes on its own
    with tempfile.TemporaryDirectory(prefix="bench_decode_", dir=args.workdir) as workdir:
        save_for_conversion(marian.cpu(), Path(workdir) / "hf")
        for quantization, threads in itertools.product(quantizations, thread_counts):
            name = f"ct2_{quantization}"
            system = ctranslate2_system(
                Path(workdir) / "hf", quantization, args.new_tokens, threads, Path(workdir), args.device
            )
            for (mode, batch, src), case_results in zip(cases, results):
                result = {
                    **measure(system, src, BEAM_SIZES[mode], args.new_tokens, args.repeats),
                    "intra_threads": threads,
                }
                report(size, mode, batch, f"{name} ({threads} threads)", result)
                if result.get("tokens_per_s", 0) >= case_results.get(name, {}).get("tokens_per_s", 0):
                    case_results[name] = result  # CTranslate2 at its best thread count
            if isinstance(system, CTranslate2):
                info["ct2_compute_types"][name] = system.translator.compute_type
                if quantization == "float32":
                    info["ct2_float32_greedy_agreement_with_hf"] = ct2_agreement(
                        torch_systems["hf"], system, random_sources(4, args.source_length)
                    )
            del system
            gc.collect()  # stops the translator's threads before anything else is timed
    rows = [
        {
            "size": size,
            "mode": mode,
            "batch": batch,
            "results": case_results,
            "ours_over_hf": speed_ratio(case_results, "ours", "hf"),
            f"ours_over_ct2_{quantizations[0]}": speed_ratio(case_results, "ours", f"ct2_{quantizations[0]}"),
        }
        for (mode, batch, _), case_results in zip(cases, results)
    ]
    return rows, info


def report(size: str, mode: str, batch: int, name: str, result: dict) -> None:
    print(f"  {size} {mode} batch {batch} {name}: {describe(result)}", file=sys.stderr, flush=True)


def describe(result: dict) -> str:
    return f"{result['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in result else f"n/a ({result['error']})"


# --- reporting


def print_table(rows: list[dict], cache_ablation: bool, quantizations: tuple[str, ...]) -> None:
    """The table of every case (empty cells: n/a, with the reasons listed below it)."""
    headers = ["size", "mode", "batch", "ours tok/s", "ours ms/sent", "HF tok/s", "HF ms/sent", "ours/HF"]
    headers += [f"CT2-{quantization} tok/s" for quantization in quantizations] + [f"ours/CT2-{quantizations[0]}"]
    if cache_ablation:
        headers.append("uncached tok/s")
    notes: dict[str, list[str]] = {}
    cells = []
    for row in rows:
        results = row["results"]
        for name, result in results.items():
            if "error" in result:
                notes.setdefault(f"{name}: {result['error']}", []).append(f"{row['size']} {row['mode']} {row['batch']}")
        line = [
            row["size"],
            row["mode"],
            row["batch"],
            number(results["ours"], "tokens_per_s"),
            number(results["ours"], "ms_per_sentence", 1),
            number(results["hf"], "tokens_per_s"),
            number(results["hf"], "ms_per_sentence", 1),
            rounded(row["ours_over_hf"]),
            *(number(results[f"ct2_{quantization}"], "tokens_per_s") for quantization in quantizations),
            rounded(row[f"ours_over_ct2_{quantizations[0]}"]),
        ]
        if cache_ablation:
            line.append(number(results["ours_uncached"], "tokens_per_s"))
        cells.append(line)
    print(markdown_table(headers, cells))
    for note, cases in notes.items():
        print(f"n/a {note} ({', '.join(cases)})")


def number(result: dict, key: str, digits: int = 0) -> float | int | None:
    return rounded(result.get(key), digits)


def rounded(value: float | None, digits: int = 2) -> float | int | None:
    if value is None:
        return None
    return round(value) if digits == 0 else round(value, digits)


def report_of(args: argparse.Namespace, rows: list[dict], sizes: dict) -> dict:
    return {
        "benchmark": "decoding speed: ours vs Transformers MarianMTModel vs CTranslate2, forced output length",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "ctranslate2": ctranslate2.__version__ if ctranslate2 else None,
        },
        "threads": args.threads,
        "device": args.device,
        "repeats": args.repeats,
        "new_tokens": args.new_tokens,
        "source_length": args.source_length,
        "vocab_size": VOCAB,
        "sizes": sizes,
        "results": rows,
    }


# --- profiling


def profile(args: argparse.Namespace) -> None:
    """Ours, small, batch 32, beam 5, once under torch.profiler."""
    beam_size = 5
    system = Ours(build_ours("small"), args.new_tokens)
    src = random_sources(32, args.source_length)
    system.decode(src, beam_size)  # warm-up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        check_outputs(system.decode(src, beam_size), 32, args.new_tokens, system.eos)
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    arguments = parser(__doc__, "the small size, batch 1, 4 new tokens from 8-token sources, one timed run, one thread")
    arguments.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    arguments.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    arguments.add_argument("--modes", nargs="+", choices=list(BEAM_SIZES), default=list(BEAM_SIZES))
    arguments.add_argument("--new-tokens", type=int, default=32, help="output tokens per sentence, EOS suppressed")
    arguments.add_argument("--source-length", type=int, default=20, help="source tokens per sentence, EOS included")
    arguments.add_argument("--repeats", type=int, default=5, help="timed runs after one warm-up; the median counts")
    arguments.add_argument(
        "--threads", type=int, default=2, help="torch threads; CTranslate2 runs with 1 and with these"
    )
    arguments.add_argument("--cache-ablation", action="store_true", help="also time ours greedy without the KV cache")
    arguments.add_argument(
        "--device", choices=list(CT2_QUANTIZATIONS), default="cpu", help="where every system decodes"
    )
    arguments.add_argument(
        "--profile",
        action="store_true",
        help="only profile ours (small, beam 5, batch 32) and print the top ops by self CPU time",
    )
    arguments.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "attn-bench",
        help="where the CTranslate2 conversions are written (each in a temporary directory, removed after)",
    )
    args = arguments.parse_args()
    if args.json is None and not args.smoke:
        args.json = REPO / "bench_results" / "decode.json"
    if args.smoke:
        args.sizes, args.batch_sizes, args.new_tokens, args.source_length = ["small"], [1], 4, 8
        args.repeats, args.threads = 1, 1

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.profile:
        profile(args)
        return

    rows, sizes = [], {}
    for size in args.sizes:
        size_rows, sizes[size] = bench_size(size, args)
        rows += size_rows
    print(
        f"decoding {args.new_tokens} new tokens per sentence from {args.source_length}-token sources, "
        f"vocabulary {VOCAB}, {args.threads} threads, on {args.device}, median of {args.repeats}; "
        "ratios > 1: ours is faster"
    )
    for size, info in sizes.items():
        share = info["ct2_float32_greedy_agreement_with_hf"]
        if share is not None:
            print(f"{size}: CTranslate2 float32 and Transformers agree on {share:.1%} of greedy tokens")
    print_table(rows, args.cache_ablation, CT2_QUANTIZATIONS[args.device])
    write_report(args.json, report_of(args, rows, sizes), args)


if __name__ == "__main__":
    main()
