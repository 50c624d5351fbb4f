"""The formats real data comes in: compression recognised by its first bytes (zstd among them), an
OPUS Moses .zip, TMX, a Hugging Face dataset, each trained on by `attn train`; and the errors that
say what went wrong before a file is skipped line by line."""

import gzip
import zipfile
from pathlib import Path

import pytest
from support.runs import train_tiny

from attn_cli.config import CorpusConfig, DataConfig
from attn_cli.data.corpus import FIRST_LINES, DataError, ReadReport, read_corpus
from attn_cli.data.split import split_corpus

SOURCES = [f"This is sentence number {i}." for i in range(300)]
TARGETS = [f"这是第{i}个句子。" for i in range(300)]
TSV = "".join(f"{s}\t{t}\n" for s, t in zip(SOURCES, TARGETS)).encode("utf-8")
PAIRS = list(zip(SOURCES, TARGETS))


def _opus_zip(path: Path, sources=SOURCES, targets=TARGETS) -> Path:
    """A .zip as OPUS's Moses downloads are: one member per language, a README and a LICENSE."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("README", "About this corpus.\n")
        archive.writestr("LICENSE", "CC-BY 2.0\n")
        archive.writestr("Tatoeba.en-zh.en", "".join(f"{s}\n" for s in sources))
        archive.writestr("Tatoeba.en-zh.zh", "".join(f"{t}\n" for t in targets))
    return path


def _tmx(path: Path, units: list[tuple[str, str]], extra: str = "") -> Path:
    body = "".join(
        f'<tu><tuv xml:lang="en-US"><seg>{s}</seg></tuv><tuv lang="zh-CN"><seg>{t}</seg></tuv></tu>\n' for s, t in units
    )
    path.write_text(
        f'<?xml version="1.0" encoding="UTF-8"?>\n<tmx version="1.4"><header srclang="en"/><body>\n{body}{extra}'
        "</body></tmx>\n",
        encoding="utf-8",
    )
    return path


def test_an_opus_moses_zip_reads_the_members_of_the_two_languages(tmp_path):
    archive = str(_opus_zip(tmp_path / "en-zh.txt.zip"))
    corpus = CorpusConfig(format="text", src_path=archive, tgt_path=archive)
    assert read_corpus(corpus, languages=("en", "zh")) == PAIRS
    assert read_corpus(corpus, languages=("zh", "en")) == [(t, s) for s, t in PAIRS]


def test_a_zip_member_is_named_by_the_config_and_a_wrong_name_lists_the_members(tmp_path):
    archive = tmp_path / "corpus.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("train.tsv", TSV)
        zipped.writestr("other.tsv", "a\tb\n")
    assert read_corpus(CorpusConfig(path=str(archive), member="train.tsv")) == PAIRS
    with pytest.raises(DataError, match=r"holds train.tsv, other.tsv: name the one to read with data.corpus.member"):
        read_corpus(CorpusConfig(path=str(archive)))
    with pytest.raises(DataError, match=r"no member 'nope.tsv' \(data.corpus.member\); it holds train.tsv"):
        read_corpus(CorpusConfig(path=str(archive), member="nope.tsv"))


def test_compression_is_recognised_by_the_first_bytes_whatever_the_name(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    zst = tmp_path / "corpus.tsv.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(TSV))
    misnamed = tmp_path / "corpus.tsv"  # gzip, named as plain text
    misnamed.write_bytes(gzip.compress(TSV))
    text_beginning_like_bz2 = tmp_path / "bzh.tsv"
    text_beginning_like_bz2.write_bytes(b"BZh is a word\tBZh\n" + TSV)
    assert read_corpus(CorpusConfig(path=str(zst))) == PAIRS
    assert read_corpus(CorpusConfig(path=str(misnamed))) == PAIRS
    assert read_corpus(CorpusConfig(path=str(text_beginning_like_bz2))) == [("BZh is a word", "BZh"), *PAIRS]


def test_tmx_pairs_the_variants_by_primary_subtag_and_leaves_out_inline_codes(tmp_path):
    extra = (
        '<tu><tuv xml:lang="en"><seg>Only English.</seg></tuv></tu>\n'
        '<tu><tuv xml:lang="en"><seg>Press <bpt i="1">&lt;b&gt;</bpt>Enter<ept i="1">&lt;/b&gt;</ept> now.</seg>'
        '</tuv><tuv xml:lang="zh"><seg>现在按<ph>&lt;br/&gt;</ph>回车。</seg></tuv></tu>\n'
    )
    report = ReadReport()
    pairs = read_corpus(
        CorpusConfig(format="tmx", path=str(_tmx(tmp_path / "c.tmx", PAIRS[:5], extra))),
        report=report,
        languages=("en", "zh-Hans"),
    )
    assert pairs == [*PAIRS[:5], ("Press Enter now.", "现在按回车。")]
    assert [(s.line, s.reason) for s in report.skipped] == [(6, "translation unit without a zh-Hans variant")]


def test_tmx_that_is_not_well_formed_names_the_line(tmp_path):
    broken = _tmx(tmp_path / "c.tmx", PAIRS[:3], extra="<tu><tuv xml:lang='en'><seg>unclosed</tuv></tu>\n")
    with pytest.raises(DataError, match=r"c.tmx:6: not well-formed XML"):
        read_corpus(CorpusConfig(format="tmx", path=str(broken)))


@pytest.mark.parametrize(
    "content, corpus, guess",
    [
        (b"\x00\x01\x02\xff\xfe binary\n" * 300, {}, "is it binary, or in another encoding"),
        ("".join(f"{s}\n" for s in SOURCES).encode(), {}, "the lines have no tab"),
        (TSV, {"format": "jsonl"}, "is it JSON lines"),
    ],
)
def test_a_file_read_the_wrong_way_stops_at_its_first_lines_with_a_guess(tmp_path, content, corpus, guess):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    report = ReadReport()
    with pytest.raises(DataError, match=rf"of the first {FIRST_LINES} lines are malformed .*{guess}"):
        read_corpus(CorpusConfig(path=str(path), **corpus), report=report)
    assert len(report.skipped) <= FIRST_LINES, "it stopped at the first lines"


def test_too_few_pairs_says_which_lines_were_skipped_and_why(tmp_path):
    path = tmp_path / "corpus.tsv"
    path.write_bytes(TSV[: TSV.index(b"\n", 500) + 1] + b"no tab here\nnor here\n")
    with pytest.raises(DataError, match=r"leave no training data.*skipped 2 malformed lines: .*no tab|found 1"):
        split_corpus(DataConfig(corpus=CorpusConfig(path=str(path)), valid_size=50, test_size=50), ReadReport())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["opus-zip", "tmx", "zst", "hf"])
def test_attn_train_trains_on_each_format(tmp_path, kind):
    if kind == "opus-zip":
        archive = _opus_zip(tmp_path / "en-zh.txt.zip")
        settings = ["data.corpus.format=text", f"data.corpus.src_path={archive}", f"data.corpus.tgt_path={archive}"]
    elif kind == "tmx":
        settings = ["data.corpus.format=tmx", f"data.corpus.path={_tmx(tmp_path / 'c.tmx', PAIRS)}"]
    elif kind == "hf":
        datasets = pytest.importorskip("datasets")
        saved = tmp_path / "dataset"
        datasets.Dataset.from_dict({"translation": [{"en": s, "zh": t} for s, t in PAIRS]}).save_to_disk(str(saved))
        settings = ["data.corpus.format=hf", f"data.corpus.path={saved}"]
        settings += ["data.corpus.src_field=translation.en", "data.corpus.tgt_field=translation.zh"]
    else:
        zstandard = pytest.importorskip("zstandard")
        zst = tmp_path / "c.tsv.zst"
        zst.write_bytes(zstandard.ZstdCompressor().compress(TSV))
        settings = [f"data.corpus.path={zst}"]
    run = tmp_path / "run"
    result = train_tiny(
        run,
        *settings,
        "data.valid_size=20",
        "data.test_size=20",
        "tokenizer.vocab_size=400",
        "train.max_steps=2",
        "data.src_lang=en",
        "data.tgt_lang=zh",
    )
    assert result.exit_code == 0, result.output
    trained = (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()
    assert len(trained) == 20 and set(trained) <= set(SOURCES)
