"""Sequence-level distillation: a teacher, a student trained on the corpus, a student trained on the
teacher's translations; quality, and speed through `attn export` int8.

1. Teacher: --teacher, a run of the default config (`en-zh.yaml`), or one trained here for
   --teacher-steps updates.
2. `attn distill --run TEACHER --student-config ...`: the teacher translates its training sources
   with its beam search (the split made again: no validation or test source among them), and
   writes the student's config (the built-in student.yaml: 4 encoder layers, 2 decoder layers,
   greedy search).
3. Students of the same size and budget (--student-steps updates): one on the distilled corpus,
   one on the teacher's own training pairs (the built-in corpus, the teacher's held-out sources
   left out). Both are validated and tested on the teacher's held-out files.
4. BLEU of all three on the teacher's test split (`attn eval`, each config's search: the
   teacher's beam of 5, the students' greedy one), the teacher's also with greedy search; and
   sentences/s of each int8 export (`attn export --quantization int8`, CTranslate2, one thread)
   translating the test sources at batch 1 (--batch1-sentences of them, one per call) and at
   batch 32, with the same searches; medians of --repeats rounds taken in turn.

    python3 -m bench.distill --teacher runs/en-zh --student-steps 2400 --json bench_results/distill.json
    python3 -m bench.distill --teacher runs/en-zh --keep-distilled ...  # the distilled corpus of a run before
    python3 -m bench.distill --smoke --json /tmp/distill.json
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from bench.toolkit import alternate, attn, eval_scores, markdown_table, median, parser, ratio, settings, write_report


def bleu(checkpoint: Path, teacher: Path, *flags: str) -> float:
    """BLEU of `checkpoint` on the teacher's test split, decoded as its config says (or `flags`)."""
    output = attn("eval", "--checkpoint", checkpoint, "--run", teacher, *flags)
    return eval_scores(output)["bleu"]


def distilled_against_corpus(teacher: Path, distilled: Path) -> dict:
    """How far the distilled corpus is from the corpus it was made from: BLEU of the teacher's
    translations against the corpus's own references (the same training pairs, in order), the share
    translated word for word, and their length ratio."""
    import sacrebleu

    from attn_cli.config import load_config
    from attn_cli.data.split import split_corpus
    from attn_cli.languages import bleu_tokenizer

    data = load_config(teacher / "config.yaml").data
    split = split_corpus(data)
    pairs = [
        pair
        for number, pair in split.directed_train_pairs()
        if data.directed_corpora[number].direction == data.languages
    ]
    rows = [line.split("\t") for line in distilled.read_text(encoding="utf-8").splitlines()]
    assert [source for source, _ in pairs] == [row[0] for row in rows], "the distilled sources are not the corpus's"
    translations, references = [row[1] for row in rows], [target for _, target in pairs]
    score = sacrebleu.corpus_bleu(translations, [references], tokenize=bleu_tokenizer(data.tgt_lang))
    return {
        "bleu": round(score.score, 2),
        "identical": round(sum(a == b for a, b in zip(translations, references)) / len(rows), 3),
        "length_ratio": round(score.sys_len / score.ref_len, 3),
    }


def step_costs(exports: dict[str, Path], sources: list[str], repeats: int) -> dict[str, dict]:
    """Where a batch-1 greedy translation's time goes in each export, CTranslate2 alone (one thread):
    milliseconds to the first output token (the encoder and one decoder step), per further token,
    and the output tokens per sentence. Medians of `repeats` rounds taken in turn."""
    from attn_cli.engines.load import load_engine

    engines = {name: load_engine([], [], path, "cpu", threads=1) for name, path in exports.items()}

    def greedy(engine, limit: int):
        pieces = [engine.tokenizers.source.id_to_piece(ids) for ids in engine.tokenizers.encode_sources(sources)]
        translate = engine.translator.translate_batch
        return lambda: [
            translate([one], beam_size=1, max_input_length=0, max_decoding_length=limit)[0] for one in pieces
        ]

    calls = {(name, limit): greedy(engine, limit) for name, engine in engines.items() for limit in (1, 256)}
    seconds = {key: median(taken) for key, taken in alternate(calls, repeats).items()}
    found = {}
    for name in engines:
        tokens = sum(len(result.hypotheses[0]) for result in calls[name, 256]()) / len(sources)
        first, whole = seconds[name, 1], seconds[name, 256]
        found[name] = {
            "first token ms": round(1000 * first / len(sources), 3),
            "further token ms": round(1000 * (whole - first) / len(sources) / max(tokens - 1, 1e-9), 3),
            "output tokens": round(tokens, 2),
        }
    return found


def speeds(exports: dict[str, Path], sources: list[str], batch1: int, repeats: int) -> dict[str, dict]:
    """Sentences/s of each export at batch 1 and at batch 32, measured in turn, each with its own
    config's decode settings ("greedy" in a name: the same with beam 1)."""
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    engines = {name: load_engine([], [], path, "cpu", threads=1) for name, path in exports.items()}

    def batches(engine, size: int, texts: list[str], greedy: bool):
        options = dataclasses.replace(engine.config.decode, beam_size=1) if greedy else engine.config.decode
        return lambda: [
            translate(engine, [Source(t) for t in texts[i : i + size]], options) for i in range(0, len(texts), size)
        ]

    found: dict[str, dict] = {name: {} for name in exports}
    for size, texts in ((1, sources[:batch1]), (32, sources)):
        calls = {name: batches(engine, size, texts, "greedy" in name) for name, engine in engines.items()}
        seconds = alternate(calls, repeats)
        for name, taken in seconds.items():
            found[name][f"batch {size}"] = round(len(texts) / median(taken), 1)
    return found


def main() -> None:
    arguments = parser(__doc__, "tiny.yaml teacher and students, a few updates each, 100 sources distilled")
    arguments.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "attn-bench" / "distill")
    arguments.add_argument("--teacher", type=Path, help="a run of en-zh.yaml to distill (default: train one here)")
    arguments.add_argument("--teacher-steps", type=int, default=4722)
    arguments.add_argument("--student-steps", type=int, default=2400)
    arguments.add_argument("--batch1-sentences", type=int, default=200)
    arguments.add_argument("--repeats", type=int, default=3)
    arguments.add_argument(
        "--keep-distilled",
        action="store_true",
        help="keep the workdir's distilled corpus of an earlier run (attn distill goes on where it stopped)",
    )
    args = arguments.parse_args()
    teacher_config, teacher_data, smoke = "en-zh.yaml", [], []
    if args.smoke:
        args.workdir = args.workdir / "distill-smoke"
        teacher_config, args.teacher_steps, args.student_steps = "tiny.yaml", 3, 3
        args.batch1_sentences, args.repeats, teacher_data = 5, 1, ["data.max_pairs=300"]
        # the student.yaml shape at tiny.yaml's sizes, on tiny.yaml's 1,200 pairs
        smoke = [
            "model.d_model=32",
            "model.ffn_dim=64",
            "tokenizer.vocab_size=1000",
            "tokenizer.character_coverage=0.98",
        ]
        smoke += ["train.max_tokens=1024", "train.valid_bleu=false"]
        args.teacher = None
    kept = args.workdir / "distilled.tsv" if args.keep_distilled else None
    for entry in args.workdir.glob("*") if args.workdir.is_dir() else []:
        if kept is None or not entry.name.startswith(kept.name):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.teacher is None:
        args.teacher = args.workdir / "teacher"
        attn(
            "train",
            "--config",
            teacher_config,
            *settings(
                f"run_dir={args.teacher}",
                f"train.max_steps={args.teacher_steps}",
                "train.max_minutes=null",
                *teacher_data,
            ),
        )
    teacher = args.teacher.resolve()
    teacher_seconds = time.perf_counter() - started

    distilled, student_yaml = args.workdir / "distilled.tsv", args.workdir / "student-distilled.yaml"
    started = time.perf_counter()
    attn(
        "distill",
        "--run",
        teacher,
        "--output",
        distilled,
        "--student-config",
        student_yaml,
        "--student-run",
        args.workdir / "student-distilled",
        # smoke: a teacher of 3 updates may say nothing, so the corpus is mixed in for the student to learn from
        *(["--max-len-a", "0", "--max-len-b", "8", "--beam", "1", "--original-weight", "1"] if args.smoke else []),
    )
    distill_seconds = time.perf_counter() - started
    against_corpus = distilled_against_corpus(teacher, distilled)
    held_out = {
        line for split in ("valid", "test") for line in (teacher / "data" / f"{split}.en").read_text().splitlines()
    }
    sources = Path(f"{distilled}.sources").read_text(encoding="utf-8").splitlines()
    assert not held_out & set(sources), "a held-out source was distilled"

    budget = [f"train.max_steps={args.student_steps}", "train.max_minutes=null", *smoke]
    attn("train", "--config", student_yaml, *settings(*budget))
    data = teacher / "data"
    original = [
        f"run_dir={args.workdir / 'student-original'}",
        f"data.valid_corpus={{format: text, src_path: '{data / 'valid.en'}', tgt_path: '{data / 'valid.zh'}'}}",
        f"data.test_corpus={{format: text, src_path: '{data / 'test.en'}', tgt_path: '{data / 'test.zh'}'}}",
        "data.filters.held_out=true",
        *(["data.max_pairs=300"] if args.smoke else []),
    ]
    attn("train", "--config", "student.yaml", *settings(*original, *budget))

    runs = {"teacher": teacher, "student, original": args.workdir / "student-original"}
    runs["student, distilled"] = args.workdir / "student-distilled"
    quality = {name: bleu(run / "checkpoints" / "best.pt", teacher) for name, run in runs.items()}
    exports = {}
    for name, run in runs.items():
        exports[name] = args.workdir / f"{run.name}-int8"
        attn("export", "--run", run, "--output", exports[name], "--quantization", "int8")
    # The teacher searched greedily too, the way the students do: what the beam costs and gives.
    quality["teacher, greedy"] = bleu(teacher / "checkpoints" / "best.pt", teacher, "--beam", "1")
    exports["teacher, greedy"] = exports["teacher"]
    test_sources = (data / "test.en").read_text(encoding="utf-8").splitlines()
    speed = speeds(exports, test_sources, args.batch1_sentences, args.repeats)
    del exports["teacher, greedy"]
    costs = step_costs(exports, test_sources[: args.batch1_sentences], args.repeats)

    print(
        f"\nteacher {teacher} ({teacher_seconds / 60:.0f} min here); {len(sources):,} sources distilled in "
        f"{distill_seconds / 60:.1f} min; students {args.student_steps:,} updates each\n"
        f"the distilled corpus against the corpus's references: {against_corpus}\n"
    )
    rows = [
        [
            name,
            quality[name],
            speed[name]["batch 1"],
            speed[name]["batch 32"],
            round(ratio(speed[name]["batch 1"], speed["teacher"]["batch 1"]), 2),
        ]
        for name in ("teacher", "teacher, greedy", *list(runs)[1:])
    ]
    headers = ["model", "test BLEU", "int8 sentences/s, batch 1", "batch 32", "batch 1 vs teacher"]
    print(markdown_table(headers, rows))
    headers = ["model, greedy, batch 1", "ms to the first token", "ms per further token", "tokens per sentence"]
    print("\n" + markdown_table(headers, [[name, *cost.values()] for name, cost in costs.items()]))
    report = {
        "bleu": quality,
        "sentences_per_second": speed,
        "greedy_step_costs": costs,
        "teacher": str(teacher),
        "student_steps": args.student_steps,
        "distilled_sources": len(sources),
        "distill_seconds": round(distill_seconds),
        "distilled_corpus_kept": args.keep_distilled,
        "distilled_against_corpus": against_corpus,
    }
    write_report(args.json, report, args)


if __name__ == "__main__":
    main()
