"""Tests for attn_cli.data: readers, splitting, length filtering, batching and collation."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from support.models import random_examples
from support.runs import one_way

from attn_cli.config import CorpusConfig, DataConfig
from attn_cli.data.batching import Example, filter_by_length, token_batches
from attn_cli.data.collate import collate
from attn_cli.data.corpus import DataError, ReadReport, SkippedLine, iter_numbered_corpus, read_corpus
from attn_cli.data.split import split_corpus
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID

JSONL_RECORDS = [
    {"translation": {"en": "Hi.", "zh": "嗨。"}},
    {"translation": {"en": " Run! ", "zh": "跑！"}},
    {"translation": {"en": "Thank you.", "zh": "谢谢。"}},
]
JSONL_PAIRS = [("Hi.", "嗨。"), ("Run!", "跑！"), ("Thank you.", "谢谢。")]


def write_bytes(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def tsv_cfg(path: str) -> CorpusConfig:
    return CorpusConfig(format="tsv", path=path)


# ---------------------------------------------------------------------------------------------
# TSV


@pytest.fixture
def messy_tsv(tmp_path: Path) -> str:
    lines = [
        "Hi.\t嗨。\tCC-BY 2.0 (France) Attribution: tatoeba.org",  # 1, BOM before it
        "  Run!  \t 跑！ \tattribution",  # 2, padded sides
        "",  # 3, blank: silently ignored
        "only one field",  # 4, malformed
        "Wait.\t\tattribution",  # 5, empty target
        "Go.\t走。",  # 6, no attribution column
        "",  # trailing empty line
    ]
    return write_bytes(tmp_path / "cmn.txt", b"\xef\xbb\xbf" + "\n".join(lines).encode("utf-8"))


def test_tsv_reads_pairs_and_reports_malformed_lines(messy_tsv: str) -> None:
    report = ReadReport()
    pairs = read_corpus(tsv_cfg(messy_tsv), report=report)
    assert pairs == [("Hi.", "嗨。"), ("Run!", "跑！"), ("Go.", "走。")]
    assert report.read == 3
    assert report.skipped == [
        SkippedLine(messy_tsv, 4, "expected at least 2 tab-separated fields, found 1"),
        SkippedLine(messy_tsv, 5, "empty target"),
    ]
    summary = report.summary()
    assert summary.startswith("skipped 2 malformed lines: ")
    assert f"{messy_tsv}:4 (expected" in summary and f"{messy_tsv}:5 (empty target)" in summary
    assert ReadReport().summary() == ""


def test_report_summary_truncates_long_lists() -> None:
    report = ReadReport(kept_examples=4)
    for n in range(1, 9):
        report.skip(SkippedLine("a.txt", n, "empty target"))
    assert len(report.skipped) == 4 and report.reasons == {"empty target": 8}  # counted, not all kept
    summary = report.summary(limit=3)
    assert summary == (
        "skipped 8 malformed lines: a.txt:1 (empty target), a.txt:2 (empty target), a.txt:3 (empty target), and 5 more"
    )


def test_tsv_strict_raises_with_file_and_line(messy_tsv: str) -> None:
    with pytest.raises(DataError) as error:
        read_corpus(tsv_cfg(messy_tsv), strict=True)
    assert f"{messy_tsv}:4:" in str(error.value)
    assert "data.strict" in str(error.value)


def test_numbered_pairs_carry_the_line_they_were_read_from(messy_tsv: str, tmp_path: Path) -> None:
    # Blank and malformed lines are skipped, yet each pair keeps its own line.
    assert list(iter_numbered_corpus(tsv_cfg(messy_tsv))) == [
        (1, ("Hi.", "嗨。")),
        (2, ("Run!", "跑！")),
        (6, ("Go.", "走。")),
    ]
    src = write_bytes(tmp_path / "a.en", "A.\n\nC.\n".encode("utf-8"))
    tgt = write_bytes(tmp_path / "a.zh", "甲。\n\n丙。\n".encode("utf-8"))
    text = CorpusConfig(format="text", src_path=src, tgt_path=tgt)
    assert list(iter_numbered_corpus(text)) == [(1, ("A.", "甲。")), (3, ("C.", "丙。"))]


def test_tsv_columns_are_configurable(tmp_path: Path) -> None:
    path = write_bytes(tmp_path / "c.tsv", "id1\t你好\tHello\n".encode("utf-8"))
    cfg = CorpusConfig(format="tsv", path=path, src_column=2, tgt_column=1)
    assert read_corpus(cfg) == [("Hello", "你好")]


def test_invalid_utf8_skips_only_that_line(tmp_path: Path) -> None:
    data = "A.\t甲。\n".encode("utf-8") + b"B.\t\xff\xfe\n" + "C.\t丙。\n".encode("utf-8")
    path = write_bytes(tmp_path / "bad.tsv", data)
    report = ReadReport()
    assert read_corpus(tsv_cfg(path), report=report) == [("A.", "甲。"), ("C.", "丙。")]
    assert report.skipped == [SkippedLine(path, 2, "invalid UTF-8")]


def test_missing_file_names_path_and_config_key(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.tsv")
    with pytest.raises(DataError, match="data.corpus.path") as error:
        read_corpus(tsv_cfg(missing))
    assert missing in str(error.value)
    text_cfg = CorpusConfig(format="text", src_path=missing, tgt_path=missing)
    with pytest.raises(DataError, match="data.corpus.src_path"):
        read_corpus(text_cfg)


# ---------------------------------------------------------------------------------------------
# JSONL and text


def write_jsonl(path: Path, records: list, bad_line: str | None = None) -> str:
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    if bad_line is not None:
        lines.insert(1, bad_line)
    return write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))


def test_jsonl_nested_fields_and_bad_lines(tmp_path: Path) -> None:
    records = JSONL_RECORDS + [{"translation": {"en": "No target."}}, {"translation": {"en": "N", "zh": 5}}]
    path = write_jsonl(tmp_path / "c.jsonl", records, bad_line="{not json")
    cfg = CorpusConfig(format="jsonl", path=path, src_field="translation.en", tgt_field="translation.zh")
    report = ReadReport()
    assert read_corpus(cfg, report=report) == JSONL_PAIRS
    assert [(s.line, s.reason.split(" (")[0]) for s in report.skipped] == [
        (2, "invalid JSON"),
        (5, "missing field 'translation.zh'"),
        (6, "field 'translation.zh' is int, not a string"),
    ]
    with pytest.raises(DataError, match=r"c\.jsonl:2: invalid JSON"):
        read_corpus(cfg, strict=True)


def test_a_jsonl_lone_surrogate_is_a_malformed_line_not_a_later_failure(tmp_path: Path) -> None:
    path = write_bytes(tmp_path / "c.jsonl", b'{"en": "Hi.", "zh": "\\ud800"}\n{"en": "Go.", "zh": "\xe8\xb5\xb0"}\n')
    report = ReadReport()
    assert read_corpus(CorpusConfig(format="jsonl", path=path), report=report) == [("Go.", "走")]
    assert [(s.line, s.reason) for s in report.skipped] == [
        (1, "a lone surrogate (a \\u escape that is half of a pair)")
    ]


def test_text_format_reads_aligned_files(tmp_path: Path) -> None:
    src = write_bytes(tmp_path / "c.en", b"Hi.\n\nRun!\nWait.\n")
    tgt = write_bytes(tmp_path / "c.zh", "嗨。\n\n跑！\n\n".encode("utf-8"))
    report = ReadReport()
    pairs = read_corpus(CorpusConfig(format="text", src_path=src, tgt_path=tgt), report=report)
    assert pairs == [("Hi.", "嗨。"), ("Run!", "跑！")]
    assert report.skipped == [SkippedLine(tgt, 4, "empty target")]


def test_text_format_mismatched_line_counts(tmp_path: Path) -> None:
    src = write_bytes(tmp_path / "c.en", b"a\nb\nc\n")
    tgt = write_bytes(tmp_path / "c.zh", b"x\ny\n")
    with pytest.raises(DataError) as error:
        read_corpus(CorpusConfig(format="text", src_path=src, tgt_path=tgt))
    message = str(error.value)
    assert src in message and tgt in message
    assert "3 lines" in message and "has 2" in message


_COMPRESSORS = {".gz": "gzip", ".xz": "lzma", ".bz2": "bz2"}


def _compressed_copy(path: str, suffix: str) -> str:
    """`path` compressed by the format its new suffix names."""
    import importlib

    module = importlib.import_module(_COMPRESSORS[suffix])
    target = path + suffix
    Path(target).write_bytes(module.compress(Path(path).read_bytes()))
    return target


@pytest.mark.parametrize("suffix", [".gz", ".xz", ".bz2"])
def test_compressed_tsv_reads_the_same_pairs_and_reports_the_same_lines(messy_tsv: str, suffix: str) -> None:
    plain_report, compressed_report = ReadReport(), ReadReport()
    compressed = _compressed_copy(messy_tsv, suffix)
    assert read_corpus(tsv_cfg(compressed), report=compressed_report) == read_corpus(
        tsv_cfg(messy_tsv), report=plain_report
    )
    assert [(s.line, s.reason) for s in compressed_report.skipped] == [(s.line, s.reason) for s in plain_report.skipped]
    assert [s.source for s in compressed_report.skipped] == [compressed, compressed]


@pytest.mark.parametrize("suffix", [".gz", ".xz"])
def test_compressed_jsonl_and_text_read_like_the_plain_files(tmp_path: Path, suffix: str) -> None:
    jsonl = write_bytes(tmp_path / "c.jsonl", b'{"en": "Hi.", "zh": "\xe5\x97\xa8"}\nnot json\n')
    report = ReadReport()
    pairs = read_corpus(CorpusConfig(format="jsonl", path=_compressed_copy(jsonl, suffix)), report=report)
    assert pairs == read_corpus(CorpusConfig(format="jsonl", path=jsonl)) == [("Hi.", "嗨")]
    assert [s.line for s in report.skipped] == [2]
    src = write_bytes(tmp_path / "c.en", b"Hi.\nRun!\n")
    tgt = write_bytes(tmp_path / "c.zh", "嗨。\n跑！\n".encode("utf-8"))
    compressed = CorpusConfig(
        format="text", src_path=_compressed_copy(src, suffix), tgt_path=_compressed_copy(tgt, suffix)
    )
    assert read_corpus(compressed) == read_corpus(CorpusConfig(format="text", src_path=src, tgt_path=tgt))


def test_a_corrupt_compressed_file_is_a_data_error_naming_it(tmp_path: Path) -> None:
    broken = write_bytes(tmp_path / "c.tsv.xz", b"\xfd7zXZ\x00 this is not xz")
    with pytest.raises(DataError, match="c.tsv.xz"):
        read_corpus(tsv_cfg(broken))


def test_the_builtin_corpus_is_the_tatoeba_pairs_with_their_attribution() -> None:
    pairs = read_corpus(CorpusConfig(format="tsv", path="builtin:tatoeba-cmn-eng"))
    assert len(pairs) == 29155 and ("Hi.", "嗨。") in pairs
    with pytest.raises(DataError, match="builtin:tatoeba-cmn-eng"):
        read_corpus(CorpusConfig(format="tsv", path="builtin:no-such-corpus"))


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets (offline: a local json file and a saved dataset)


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    # Keep load_dataset's cache inside the test directory.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def test_hf_json_builder_matches_jsonl_reader(tmp_path: Path, hf_cache: None) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", JSONL_RECORDS)
    fields = dict(src_field="translation.en", tgt_field="translation.zh")
    hf = CorpusConfig(format="hf", hf_name="json", hf_data_files=path, **fields)
    assert read_corpus(hf) == read_corpus(CorpusConfig(format="jsonl", path=path, **fields)) == JSONL_PAIRS


def test_hf_data_files_may_be_a_list(tmp_path: Path, hf_cache: None) -> None:
    first = write_jsonl(tmp_path / "a.jsonl", JSONL_RECORDS)
    second = write_jsonl(tmp_path / "b.jsonl", JSONL_RECORDS)
    fields = dict(src_field="translation.en", tgt_field="translation.zh")
    hf = CorpusConfig(format="hf", hf_name="json", hf_data_files=(first, second), **fields)
    assert read_corpus(hf) == JSONL_PAIRS * 2


def test_a_streamed_dataset_reads_as_the_downloaded_one_without_writing_its_arrow_copy(
    tmp_path: Path, hf_cache: None
) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", JSONL_RECORDS)
    fields = dict(src_field="translation.en", tgt_field="translation.zh")
    streamed = CorpusConfig(format="hf", hf_name="json", hf_data_files=path, hf_streaming=True, **fields)
    assert read_corpus(streamed) == JSONL_PAIRS
    cache = tmp_path / "hf-cache"
    assert not cache.exists() or not list(cache.rglob("*.arrow"))  # nothing was converted and stored
    assert read_corpus(CorpusConfig(format="hf", hf_name="json", hf_data_files=path, **fields)) == JSONL_PAIRS
    assert list(cache.rglob("*.arrow"))  # while a download is stored whole first


def test_a_script_based_dataset_is_refused_in_one_line_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    asked = {}

    def load_dataset(name, config, split, **given):
        asked.update(given)
        raise RuntimeError("Dataset scripts are no longer supported, but found flores.py")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    hf = CorpusConfig(format="hf", hf_name="facebook/flores", hf_revision="main")
    with pytest.raises(DataError, match=r"loaded by a script.*hf_revision: refs/convert/parquet") as raised:
        read_corpus(hf)
    assert "\n" not in str(raised.value) and asked == {"revision": "main"}


def test_hf_saved_dataset_round_trip(tmp_path: Path) -> None:
    import datasets

    saved = tmp_path / "saved"
    rows = {"en": ["Hi.", " Run! ", "", "Thank you."], "zh": ["嗨。", "跑！", "空。", "谢谢。"]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(saved))
    report = ReadReport()
    pairs = read_corpus(CorpusConfig(format="hf", path=str(saved), hf_split="train"), report=report)
    assert pairs == JSONL_PAIRS
    assert report.skipped == [SkippedLine(f"hf:{saved}", 3, "empty source")]
    with pytest.raises(DataError, match="hf_split"):
        read_corpus(CorpusConfig(format="hf", path=str(saved), hf_split="validation"))
    with pytest.raises(DataError, match="src_field"):
        read_corpus(CorpusConfig(format="hf", path=str(saved), src_field="english"))
    (tmp_path / "not-saved").mkdir()
    with pytest.raises(
        DataError,
        match=r"not-saved is not a saved dataset: .* \(check data.corpus.path; it must be a "
        r"directory written by Dataset.save_to_disk\)$",
    ):
        read_corpus(CorpusConfig(format="hf", path=str(tmp_path / "not-saved")))


# ---------------------------------------------------------------------------------------------
# Splitting


def duplicated_pairs() -> list[tuple[str, str]]:
    """120 source sentences with 1-4 translations each, like Tatoeba's repeated English."""
    rng = random.Random(7)
    return [(f"sentence {s}", f"翻译 {s}-{t}") for s in range(120) for t in range(rng.randint(1, 4))]


def split_of(tmp_path: Path, pairs: list[tuple[str, str]], **data: object) -> tuple[list, list, list]:
    """(train, valid, test) of `pairs` written as a TSV file and split as a stream."""
    path = tmp_path / f"corpus-{len(list(tmp_path.iterdir()))}.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    split = split_corpus(DataConfig(corpus=tsv_cfg(str(path)), **data))
    return list(split.train_pairs()), one_way(split.valid), one_way(split.test)


def in_memory_split(pairs: list[tuple[str, str]], valid_size: int, test_size: int, seed: int) -> tuple[list, list]:
    """(valid, test) as a split of the whole corpus held in memory makes them: groups of pairs by
    source in order of first appearance, shuffled, whole groups taken for test, then for valid."""
    groups: dict[str, list] = {}
    for pair in pairs:
        groups.setdefault(pair[0], []).append(pair)
    shuffled = list(groups.values())
    random.Random(seed).shuffle(shuffled)
    taken: list[list] = [[], []]
    for part, size in ((1, test_size), (0, valid_size)):
        while len(taken[part]) < size and shuffled:
            taken[part].extend(shuffled.pop(0))
    return taken[0], taken[1]


def test_split_sizes_and_no_source_leaks_across_splits(tmp_path: Path) -> None:
    pairs = duplicated_pairs()
    train, valid, test = split_of(tmp_path, pairs, valid_size=30, test_size=40, split_seed=3)
    # Filled with whole groups of at most 4: reaches the size, exceeds it by less than a group.
    assert 40 <= len(test) < 44 and 30 <= len(valid) < 34
    sources = [{src for src, _ in part} for part in (train, valid, test)]
    assert not (sources[0] & sources[1]) and not (sources[0] & sources[2]) and not (sources[1] & sources[2])
    assert Counter(train + valid + test) == Counter(pairs)
    assert train == [pair for pair in pairs if pair in set(train)], "training pairs in corpus order"


def test_the_streamed_split_is_the_split_of_the_corpus_held_in_memory(tmp_path: Path) -> None:
    pairs = duplicated_pairs()
    random.Random(1).shuffle(pairs)  # a source's translations scattered through the corpus
    for seed, valid_size, test_size in ((3, 30, 40), (4, 1, 0), (5, 0, 7), (6, 100, 100)):
        _, valid, test = split_of(tmp_path, pairs, valid_size=valid_size, test_size=test_size, split_seed=seed)
        assert (valid, test) == in_memory_split(pairs, valid_size, test_size, seed)


def test_split_is_repeatable_per_seed(tmp_path: Path) -> None:
    pairs = duplicated_pairs()
    assert split_of(tmp_path, pairs, valid_size=30, test_size=40, split_seed=3) == split_of(
        tmp_path, pairs, valid_size=30, test_size=40, split_seed=3
    )
    assert (
        split_of(tmp_path, pairs, valid_size=30, test_size=40, split_seed=3)[2]
        != split_of(tmp_path, pairs, valid_size=30, test_size=40, split_seed=4)[2]
    )


def test_split_too_small_corpus_raises(tmp_path: Path) -> None:
    pairs = [("a", "甲"), ("b", "乙"), ("b", "乙二")]
    with pytest.raises(DataError, match="data.valid_size=1.*data.test_size=1.*3 pairs with 2 distinct"):
        split_of(tmp_path, pairs, valid_size=1, test_size=1, split_seed=0)


def test_a_corpus_that_changes_between_the_passes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "corpus.tsv"
    path.write_text("".join(f"s{i}\t句{i}\n" for i in range(20)), encoding="utf-8")
    split = split_corpus(DataConfig(corpus=tsv_cfg(str(path)), valid_size=2, test_size=2))
    path.write_text("".join(f"s{i}\t句{i}\n" for i in range(25)), encoding="utf-8")
    with pytest.raises(DataError, match="changed while it was being prepared"):
        list(split.train_pairs())


def length_sorted_tsv(path: Path, count: int) -> str:
    lines = [f"{'w ' * n}{n}\t{''.join(chr(0x4E00 + i % 50) for i in range(n))}" for n in range(1, count + 1)]
    return write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))


def test_max_pairs_samples_the_whole_corpus(tmp_path: Path) -> None:
    path = length_sorted_tsv(tmp_path / "sorted.tsv", 200)
    cfg = DataConfig(corpus=tsv_cfg(path), max_pairs=50, valid_size=5, test_size=5, split_seed=2)
    split = split_corpus(cfg)
    sampled = list(split.train_pairs()) + one_way(split.valid) + one_way(split.test)
    assert len(sampled) == 50 and len(set(sampled)) == 50 and split.train_count == 40
    # A head slice would hold only the 50 shortest lines.
    assert max(len(tgt) for _, tgt in sampled) > 100
    again = split_corpus(cfg)
    assert (list(again.train_pairs()), again.valid, again.test) == (list(split.train_pairs()), split.valid, split.test)


def test_given_valid_and_test_corpora_are_used(tmp_path: Path) -> None:
    train = length_sorted_tsv(tmp_path / "train.tsv", 30)
    valid = write_bytes(tmp_path / "valid.tsv", "V.\t五。\n".encode("utf-8"))
    test = write_bytes(tmp_path / "test.tsv", "T.\t题。\n".encode("utf-8"))
    both = split_corpus(DataConfig(corpus=tsv_cfg(train), valid_corpus=tsv_cfg(valid), test_corpus=tsv_cfg(test)))
    assert (
        len(list(both.train_pairs())) == 30
        and one_way(both.valid) == [("V.", "五。")]
        and one_way(both.test) == [("T.", "题。")]
    )
    only_valid = split_corpus(DataConfig(corpus=tsv_cfg(train), valid_corpus=tsv_cfg(valid), test_size=4))
    assert one_way(only_valid.valid) == [("V.", "五。")] and len(one_way(only_valid.test)) == 4
    assert len(list(only_valid.train_pairs())) == only_valid.train_count == 26


def test_malformed_lines_are_reported_once_however_often_the_corpus_is_read(messy_tsv: str) -> None:
    report = ReadReport()
    split = split_corpus(DataConfig(corpus=tsv_cfg(messy_tsv), valid_size=0, test_size=0), report)
    skipped = list(report.skipped)
    assert skipped and len(list(split.train_pairs())) == split.train_count == report.read
    assert report.skipped == skipped


# ---------------------------------------------------------------------------------------------
# Length filtering, collation, batching


def test_filter_by_length_drops_exactly_the_out_of_range() -> None:
    examples = [
        Example(0, [5] * 3, [6] * 4),  # kept
        Example(1, [], [6]),  # empty source
        Example(2, [5], []),  # empty target
        Example(3, [5] * 11, [6] * 10),  # source too long
        Example(4, [5] * 10, [6] * 9),  # kept: at the limits
        Example(5, [5] * 2, [6] * 9),  # ratio 4.5
        Example(6, [5] * 2, [6] * 8),  # kept: ratio exactly 4
        Example(7, [5] * 3, [6] * 10),  # kept
        Example(8, [5] * 3, [6] * 11),  # target too long
    ]
    kept, dropped = filter_by_length(examples, max_source_tokens=10, max_target_tokens=10, max_length_ratio=4.0)
    assert [e.index for e in kept] == [0, 4, 6, 7]
    assert dropped == 5


def test_collate_shapes_markers_padding_and_indices() -> None:
    batch = collate([Example(7, [10, 11, 12], [20]), Example(3, [13], [21, 22, 23, 24]), Example(9, [14], [])])
    assert batch.src.tolist() == [[10, 11, 12, EOS_ID], [13, EOS_ID, PAD_ID, PAD_ID], [14, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [
        [BOS_ID, 20, PAD_ID, PAD_ID, PAD_ID],
        [BOS_ID, 21, 22, 23, 24],
        [BOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
    ]
    assert batch.tgt_out.tolist() == [
        [20, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
        [21, 22, 23, 24, EOS_ID],
        [EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
    ]
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert batch.indices == [7, 3, 9]
    assert batch.num_source_tokens == 4 + 2 + 2 and batch.num_target_tokens == 2 + 5 + 1
    assert batch.to("cpu").src.tolist() == batch.src.tolist()


def sentence_examples(count: int) -> list[Example]:
    """Random lengths 1-60, target length close to source length as in real sentence pairs."""
    return random_examples(count, lengths=(1, 60), target_offsets=(-4, 4))


def padded_cost(examples: list[Example], batch: list[int]) -> int:
    return len(batch) * max(max(len(examples[i].src), len(examples[i].tgt)) + 1 for i in batch)


def _plan(examples, max_tokens, shuffle, seed=0, epoch=0) -> list[list[int]]:
    return [batch.tolist() for batch in token_batches(examples, max_tokens, shuffle, seed, epoch)]


def _plain_python_plan(examples, max_tokens, shuffle, seed=0, epoch=0) -> list[list[int]]:
    """The batcher as plain Python once planned it: the plan the NumPy one must keep, so that a run
    resumed by this code continues the epoch order of one started before it."""
    rng = random.Random(seed * 1000003 + epoch)
    tie_break = [rng.random() for _ in examples] if shuffle else list(range(len(examples)))
    order = sorted(
        range(len(examples)), key=lambda i: (len(examples[i].src) + 1, len(examples[i].tgt) + 1, tie_break[i])
    )
    batches, batch, longest = [], [], 0
    for position in order:
        length = max(len(examples[position].src), len(examples[position].tgt)) + 1
        if batch and (len(batch) + 1) * max(longest, length) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(position)
        longest = max(longest, length)
    batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


def test_token_batches_plan_as_the_plain_python_batcher() -> None:
    examples = sentence_examples(700)
    for shuffle, seed, epoch, budget in [(False, 0, 0, 300), (True, 1, 0, 300), (True, 1, 3, 1000), (True, 7, 2, 64)]:
        assert _plan(examples, budget, shuffle, seed, epoch) == _plain_python_plan(
            examples, budget, shuffle, seed, epoch
        )


def test_token_batches_cover_all_within_budget() -> None:
    examples = sentence_examples(500) + [Example(500, [5] * 300, [6] * 2)]  # alone exceeds the budget
    for shuffle in (False, True):
        batches = _plan(examples, 256, shuffle, seed=1)
        assert sorted(i for batch in batches for i in batch) == list(range(len(examples)))
        for batch in batches:
            assert padded_cost(examples, batch) <= 256 or len(batch) == 1
        assert [500] in batches


def test_token_batches_sorted_order_without_shuffle() -> None:
    examples = sentence_examples(200)
    batches = _plan(examples, 300, shuffle=False)
    flat = [i for batch in batches for i in batch]
    keys = [(len(examples[i].src), len(examples[i].tgt)) for i in flat]
    assert keys == sorted(keys)


def test_token_batches_pad_less_than_random_batching() -> None:
    examples = sentence_examples(600)
    rng = random.Random(0)
    shuffled = list(range(len(examples)))
    rng.shuffle(shuffled)
    # Random batching with the same batch sizes the bucketed batcher chose.
    bucketed = _plan(examples, 400, shuffle=True, seed=0)
    sizes = [len(batch) for batch in bucketed]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    random_batches = [shuffled[s : s + n] for s, n in zip(starts, sizes)]
    real = sum(max(len(e.src), len(e.tgt)) + 1 for e in examples)
    bucketed_ratio = real / sum(padded_cost(examples, b) for b in bucketed)
    random_ratio = real / sum(padded_cost(examples, b) for b in random_batches)
    assert bucketed_ratio > 0.85 and bucketed_ratio > random_ratio + 0.2


def test_token_batches_repeatable_per_epoch() -> None:
    examples = sentence_examples(300)
    first = _plan(examples, 300, shuffle=True, seed=5, epoch=0)
    assert _plan(examples, 300, shuffle=True, seed=5, epoch=0) == first
    assert _plan(examples, 300, shuffle=True, seed=5, epoch=1) != first
    assert _plan(examples, 300, shuffle=True, seed=6, epoch=0) != first
    # The batches themselves are shuffled, not only ties within them.
    first_lengths = [len(examples[batch[0]].src) for batch in first]
    assert first_lengths != sorted(first_lengths)


def test_token_batches_empty_input() -> None:
    assert token_batches([], max_tokens=100, shuffle=True) == []
