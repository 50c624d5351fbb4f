"""Turn a config into what training needs: the corpus split three ways, the tokenizers, and the
training pairs tokenized and filtered, prepared once (attn_cli/data/prepared.py).

The valid and test splits are written into the run directory as plain text, so `attn eval` and
anyone else can score against exactly the sentences the model never trained on.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, TypeVar

from attn_cli.config import Config, ConfigError
from attn_cli.data.batching import Example, within_length_limits
from attn_cli.data.corpus import HeldOut, Pair, ReadReport
from attn_cli.data.filters import languages_disagree
from attn_cli.data.prepared import (
    PreparedData,
    TokenizedPairsWriter,
    entry_name,
    open_prepared,
    remove_entries_but,
    save_prepared,
)
from attn_cli.data.progress import StageProgress
from attn_cli.data.split import CorpusSplit, split_corpus
from attn_cli.data.tokenizer import Tokenizers, train_tokenizers
from attn_cli.data.weighting import weighted_stream
from attn_cli.files import write_whole
from attn_cli.paths import RunPaths

Log = Callable[[str], None]
T = TypeVar("T")

# Training pairs tokenized at a time: large enough for SentencePiece's threads, small in memory.
_ENCODE_CHUNK = 20_000


SHOWN_REMOVED = 3  # pairs shown per filter rule, unless --show-removed says otherwise


def read_split(
    cfg: Config, log: Log = print, report: Optional[ReadReport] = None, shown_removed: int = SHOWN_REMOVED
) -> CorpusSplit:
    """The corpus split three ways, read as a stream (attn_cli/data/split.py); the log gets what
    was skipped and removed, with `shown_removed` of the pairs each filter rule removed."""
    report = report if report is not None else ReadReport()
    split = split_corpus(cfg.data, report, StageProgress(log).track)
    if report.skipped_count:
        log(report.summary())
    several = len(split.reads) > 1
    for found in split.reads:
        name = f"{found.corpus.label}: " if several else ""
        if found.removals.counts:
            log(f"{name}{found.removals.summary(found.read)}")
        elif several:
            log(f"{name}{found.read:,} pairs read")
        for line in removed_examples(removed_example_rows(found.removals), shown_removed):
            log(line)
    log(f"corpus: {split.train_count:,} training, {held_out_counts(split.valid, split.test)}")
    if several and not (cfg.data.valid_corpus and cfg.data.test_corpus):
        log(f"validation and test pairs drawn from: {', '.join(split_sources(cfg))}")
    for direction in split.valid.keys() | split.test.keys():
        held_out = [*split.valid.get(direction, []), *split.test.get(direction, [])]
        if disagreeing := languages_disagree(held_out, direction):
            log(f"warning: {disagreeing}")
    return split


def held_out_counts(valid: HeldOut, test: HeldOut) -> str:
    """ "500 validation, 1,000 test pairs", by direction for a model of several."""
    if len(valid.keys() | test.keys()) <= 1:
        return f"{sum(map(len, valid.values())):,} validation, {sum(map(len, test.values())):,} test pairs"
    each = [
        f"{direction} {len(valid.get(direction, [])):,}/{len(test.get(direction, [])):,}"
        for direction in dict.fromkeys([*valid, *test])
    ]
    return f"validation/test pairs {', '.join(each)}"


def removed_example_rows(removals) -> dict[str, list[list]]:
    """The pairs each rule removed, as the prepared data's statistics keep them: [line, source,
    target], or [line] for a rule across pairs (duplicates, held out), which keeps no text."""
    return {
        rule: [[line, *pair] if pair else [line] for line, pair in examples]
        for rule, examples in removals.examples.items()
    }


def removed_examples(rows: dict[str, list[list]], shown: int) -> list[str]:
    """Log lines showing up to `shown` removed pairs per rule."""
    lines = []
    for rule, examples in rows.items():
        if shown > 0 and examples:
            each = "; ".join(
                f"line {row[0]}" + (f": {row[1]!r} → {row[2]!r}" if len(row) == 3 else "") for row in examples[:shown]
            )
            lines.append(f"  {rule}, e.g. {each}")
    return lines


def split_sources(cfg: Config) -> list[str]:
    """The training corpora that validation and test pairs are carved off."""
    return [corpus.label for corpus in cfg.data.training_corpora if corpus.split]


def write_splits(cfg: Config, splits: CorpusSplit | PreparedData) -> None:
    """The validation and test pairs as plain text in the run's data/, a file per side and
    direction (RunPaths.held_out_files)."""
    paths = RunPaths.of(cfg.run_dir)
    paths.data_dir.mkdir(parents=True, exist_ok=True)
    several = len(cfg.data.directions) > 1
    for name, held_out in (("valid", splits.valid), ("test", splits.test)):
        for direction, pairs in held_out.items():
            for side, file in enumerate(paths.held_out_files(name, direction, several)):
                write_whole(file, "".join(pair[side].replace("\n", " ") + "\n" for pair in pairs))


def cache_dir(cfg: Config) -> Path:
    """Where prepared data is kept: data.cache_dir, shared by the runs that name it, or the run's own."""
    return Path(cfg.data.cache_dir) if cfg.data.cache_dir else RunPaths.of(cfg.run_dir).prepared_dir


def saved_tokenizers(cfg: Config, log: Log = print) -> Tokenizers | None:
    """The run's tokenizer, when it has one (a restart, `attn tokenizer`): found without reading the corpus."""
    directory = RunPaths.of(cfg.run_dir).tokenizer_dir
    if not Tokenizers.exists(directory):
        return None
    tokenizers = Tokenizers.load(directory)
    _check_reused(tokenizers, cfg, directory)
    log(f"tokenizer: reusing {directory}")
    return tokenizers


def tokenizers_and_data(
    cfg: Config, log: Log = print, tokenizers: Tokenizers | None = None, shown_removed: int = SHOWN_REMOVED
) -> tuple[Tokenizers, PreparedData]:
    """The tokenizers (`tokenizers`, else the run's saved ones, else trained on the corpus) and the
    prepared data: the data stage of `attn train` and `attn prepare`."""
    tokenizers = tokenizers if tokenizers is not None else saved_tokenizers(cfg, log)
    split, report = None, ReadReport()
    if tokenizers is None:
        split = read_split(cfg, log, report, shown_removed)
        tokenizers = train_or_load_tokenizers(cfg, split, log)
    return tokenizers, prepare_data(cfg, tokenizers, log, split, report, shown_removed)


def prepare_data(
    cfg: Config,
    tokenizers: Tokenizers,
    log: Log = print,
    split: CorpusSplit | None = None,
    report: ReadReport | None = None,
    shown_removed: int = SHOWN_REMOVED,
) -> PreparedData:
    """The prepared training data for this config and tokenizer: opened when an earlier start
    prepared it, else read (unless `split` is given, with the `report` of its reading), tokenized,
    filtered and saved. The run's valid and test files are written from it."""
    _check_tags(tokenizers, cfg, "the model's tokenizer")
    name = entry_name(cfg.data, tokenizers)
    prepared = open_prepared(cache_dir(cfg), name)
    if prepared is not None:
        log(f"data: reusing {prepared.directory} ({_describe(prepared.stats)})")
    else:
        report = report if report is not None else ReadReport()
        split = split if split is not None else read_split(cfg, log, report, shown_removed)

        def write_train(writer: TokenizedPairsWriter) -> dict:
            directed_counts = split.directed_train_counts()
            pairs = StageProgress(log).track(
                split.directed_train_pairs(), "tokenizing the training pairs", sum(directed_counts)
            )
            kept_by_corpus = _tokenize_into(writer, pairs, tokenizers, cfg)
            kept = sum(kept_by_corpus)
            dropped = sum(directed_counts) - kept
            if dropped:
                log(f"length filter: dropped {dropped:,} of {sum(directed_counts):,} training pairs")
            corpora = [
                {
                    "name": directed.label,
                    "direction": str(directed.direction),
                    "pairs_read": split.reads[directed.index].read,
                    "removed_by_filters": dict(split.reads[directed.index].removals.counts),
                    "removed_examples": removed_example_rows(split.reads[directed.index].removals),
                    "training_pairs_read": read,
                    "training_pairs": count,
                }
                for directed, read, count in zip(cfg.data.directed_corpora, directed_counts, kept_by_corpus)
            ]
            return {
                "training_pairs_read": sum(directed_counts),
                "dropped_by_length": dropped,
                "training_pairs": kept,
                "valid_pairs": sum(map(len, split.valid.values())),
                "test_pairs": sum(map(len, split.test.values())),
                "skipped_lines": dict(report.reasons),
                "corpus_pairs_read": split.read,
                "removed_by_filters": dict(split.removals.counts),
                "corpora": corpora,
                "valid_test_from": None if cfg.data.valid_corpus and cfg.data.test_corpus else split_sources(cfg),
            }

        prepared = save_prepared(cache_dir(cfg), name, write_train, split.valid, split.test)
        log(f"data: prepared in {prepared.directory}")
        if not cfg.data.cache_dir:  # the run's own: what an earlier corpus, filter or tokenizer made is spent
            remove_entries_but(cache_dir(cfg), name)
    write_splits(cfg, prepared)
    return prepared


def _tokenize_into(
    writer: TokenizedPairsWriter, pairs: Iterable[tuple[int, Pair]], tokenizers: Tokenizers, cfg: Config
) -> list[int]:
    """Tokenize (directed corpus, pair)s a chunk at a time, each source after its target language's
    tag (a multi-target model's) and its corpus's tag, and add those within the length limits to
    `writer`; how many of each directed corpus were kept."""
    directed = cfg.data.directed_corpora
    target_tags = tokenizers.target_tags
    leads = [" ".join(t for t in (target_tags.get(d.direction.target), d.tag) if t) for d in directed]
    kept = [0] * len(directed)
    for chunk in _chunks(pairs, _ENCODE_CHUNK):
        sources = tokenizers.encode_sources(
            [f"{leads[corpus]} {source}" if leads[corpus] else source for corpus, (source, _) in chunk]
        )
        targets = tokenizers.target.encode([target for _, (_, target) in chunk])
        keep = within_length_limits(
            [len(s) for s in sources],
            [len(t) for t in targets],
            cfg.data.max_source_tokens,
            cfg.data.max_target_tokens,
            cfg.data.max_length_ratio,
        ).tolist()
        writer.add([s for s, k in zip(sources, keep) if k], [t for t, k in zip(targets, keep) if k])
        for (corpus, _), k in zip(chunk, keep):
            kept[corpus] += k
    return kept


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def open_data(cfg: Config, tokenizers: Tokenizers) -> PreparedData:
    """The data another process prepared for this config and tokenizer (torchrun ranks after rank 0)."""
    prepared = open_prepared(cache_dir(cfg), entry_name(cfg.data, tokenizers))
    if prepared is None:
        raise ConfigError(
            f"no prepared data in {cache_dir(cfg)} for this config; rank 0 should have written it", "data.cache_dir"
        )
    return prepared


def _describe(stats: dict) -> str:
    return (
        f"{stats['training_pairs']:,} training pairs after the length filters, {stats['valid_pairs']:,} validation, "
        f"{stats['test_pairs']:,} test"
    )


def encode_pairs(pairs: list[Pair], tokenizers: Tokenizers, target: Optional[str] = None) -> list[Example]:
    """Token ids of each (source, target) pair, numbered in corpus order; a multi-target model's
    sources ask for `target`."""
    sources = tokenizers.encode_sources([p[0] for p in pairs], target)
    targets = tokenizers.target.encode([p[1] for p in pairs])
    return [Example(i, s, t) for i, (s, t) in enumerate(zip(sources, targets))]


def train_or_load_tokenizers(cfg: Config, split: CorpusSplit, log: Log = print, retrain: bool = False) -> Tokenizers:
    """Reuse the run's tokenizer when it has one, so resumed and repeated runs keep their vocabulary;
    else train one on a seeded sample of at most `tokenizer.max_training_sentences` training pairs."""
    directory = RunPaths.of(cfg.run_dir).tokenizer_dir
    if Tokenizers.exists(directory) and not retrain:
        tokenizers = Tokenizers.load(directory)
        _check_reused(tokenizers, cfg, directory)
        log(f"tokenizer: reusing {directory}")
        return tokenizers
    directed_counts = split.directed_train_counts()
    pairs = StageProgress(log).track(
        split.directed_train_pairs(), "sampling pairs for the tokenizer", sum(directed_counts)
    )
    weights = [corpus.weight for corpus in cfg.data.directed_corpora]
    drawn = weighted_stream(pairs, directed_counts, weights, cfg.train.seed)
    sample = reservoir_sample(drawn, cfg.tokenizer.max_training_sentences, seed=cfg.train.seed)
    kind = "joint" if cfg.tokenizer.joint else "separate"
    log(
        f"tokenizer: training {kind} SentencePiece {cfg.tokenizer.model_type} models, "
        f"vocabulary {cfg.tokenizer.vocab_size:,}, on {len(sample):,} training pairs"
    )
    tokenizers = train_tokenizers(
        [p[0] for p in sample],
        [p[1] for p in sample],
        cfg.tokenizer,
        seed=cfg.train.seed,
        tags=cfg.data.tags,
        target_tags=cfg.data.target_tags,
    )
    tokenizers.save(directory)
    log(f"tokenizer: saved to {directory}")
    return tokenizers


def reservoir_sample(items: Iterable[Pair], size: int, seed: int) -> list[Pair]:
    """A seeded uniform sample of at most `size` items, drawn in one pass over a stream of unknown
    length (every item when there are no more than `size`, in stream order)."""
    rng = random.Random(seed)
    sample: list[Pair] = []
    for seen, item in enumerate(items):
        if seen < size:
            sample.append(item)
        else:
            slot = rng.randrange(seen + 1)  # the item replaces one of the sample with chance size / (seen + 1)
            if slot < size:
                sample[slot] = item
    return sample


def _check_reused(tokenizers: Tokenizers, cfg: Config, directory) -> None:
    """A reused tokenizer must be the one the config describes, or the model is built wrong."""
    sizes = {tokenizers.source.vocab_size, tokenizers.target.vocab_size}
    if tokenizers.source_prefix != cfg.tokenizer.source_prefix:
        raise ConfigError(
            f"{directory} puts {tokenizers.source_prefix!r} before each source, but the config's "
            f"tokenizer.source_prefix is {cfg.tokenizer.source_prefix!r}; set it to {tokenizers.source_prefix!r}, "
            f"or run `attn tokenizer --retrain` with this config",
            "tokenizer.source_prefix",
        )
    _check_tags(tokenizers, cfg, str(directory))
    if tokenizers.joint != cfg.tokenizer.joint or sizes != {cfg.tokenizer.vocab_size}:
        kind = "joint" if tokenizers.joint else "separate"
        raise ConfigError(
            f"{directory} holds a {kind} tokenizer of {sorted(sizes)} pieces, but the config "
            f"asks for joint={cfg.tokenizer.joint}, vocab_size={cfg.tokenizer.vocab_size}; "
            f"run `attn tokenizer --retrain` with this config, or use another run_dir",
            "tokenizer",
        )


def _check_tags(tokenizers: Tokenizers, cfg: Config, whose: str) -> None:
    """Every tag of data.corpora is a piece of the tokenizer: spelled out in pieces, it would teach
    the model nothing of the corpus it marks."""
    if tokenizers.target_tags != cfg.data.target_tags:
        has = ", ".join(tokenizers.target_tags.values()) or "no target tags"
        wants = ", ".join(cfg.data.target_tags.values()) or "none (one target language)"
        raise ConfigError(
            f"{whose} has {has}, but the corpora's directions ask for {wants}; run `attn tokenizer --retrain` "
            f"with this config, or use another run_dir",
            "data.corpora",
        )
    missing = [tag for tag in cfg.data.tags if tag not in tokenizers.tags]
    if missing:
        raise ConfigError(
            f"{whose} has no piece for the corpus tag {missing[0]!r}: a tokenizer trained with this config has; "
            f"run `attn tokenizer --retrain` with it, or use another run_dir (a model trained without the tag, "
            f"as train.init_from, cannot learn it)",
            "data.corpora",
        )
