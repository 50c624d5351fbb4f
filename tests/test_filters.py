"""data.filters: each rule drops the noise it is for and keeps clean pairs; the rules across pairs
(duplicates, held-out sources) act on the split; every pass over the corpus sees the same pairs."""

import json
from pathlib import Path

import pytest
from support.runs import one_way

from attn_cli.config import CorpusConfig, DataConfig, FiltersConfig
from attn_cli.data.corpus import ReadReport
from attn_cli.data.filters import PairRules, Removals
from attn_cli.data.split import split_corpus

ALL_ON = FiltersConfig(
    duplicates="pair",
    held_out=True,
    copies=True,
    max_characters=200,
    max_character_ratio=9.0,
    markup=True,
    max_repeats=10,
    control_characters=True,
    min_script_share=0.5,
)

CLEAN = [
    ("Tom swam.", "Tom游泳。"),
    ("I use Twitter.", "我用Twitter。"),
    ("Wait...", "等一下……"),
    ("It costs 100 dollars.", "这要100美元。"),
    ("Do you like R&B?", "你喜欢R&B吗？"),
    ('Tom said "no".', "汤姆说“不”。"),
]
NOISE = {
    "control characters": ("Hello\x07 there.", "你好。"),
    "markup": ("Click <b>here</b>.", "点击这里。"),
    "copies": ("Hello there.", "hello  there."),
    "too long": ("a " * 150, "一" * 50),
    "length ratio": ("Someone is always on duty today.", "哈"),
    "repeated character": ("Noooooooooooooo!", "不！"),
    "script": ("I am a student.", "I am a student too."),
}


@pytest.mark.parametrize("rule", NOISE)
def test_each_rule_drops_its_noise(rule):
    rules = PairRules(ALL_ON, ("en", "zh"))
    assert rules.first_broken(*NOISE[rule]) == rule


def test_clean_pairs_break_no_rule_names_and_numbers_included():
    rules = PairRules(ALL_ON, ("en", "zh"))
    assert [rules.first_broken(*pair) for pair in CLEAN] == [None] * len(CLEAN)


def test_swapped_sides_break_the_script_rule():
    rules = PairRules(ALL_ON, ("en", "zh"))
    assert rules.first_broken("我是学生。", "I am a student.") == "script"


def test_the_rules_are_off_by_default():
    rules = PairRules(FiltersConfig(), ("en", "zh"))
    assert rules.rules == [] and all(rules.first_broken(*pair) is None for pair in NOISE.values())


def test_language_identification_drops_a_side_in_another_language():
    pytest.importorskip("py3langid")
    rules = PairRules(FiltersConfig(language_id=True), ("en", "de"))
    assert rules.first_broken("The house is small.", "Das Haus ist klein.") is None
    assert rules.first_broken("The house is small.", "La maison est petite.") == "language"


def _corpus(path: Path, pairs) -> CorpusConfig:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return CorpusConfig(path=str(path))


def test_the_split_drops_duplicates_and_held_out_sources_and_every_pass_agrees(tmp_path):
    clean = [(f"Sentence {i}.", f"句子{i}。") for i in range(60)]
    pairs = clean[:30] + [clean[3], NOISE["markup"], (clean[5][0], "另一个译文。")] + clean[30:]
    valid = _corpus(tmp_path / "valid.tsv", [clean[7], ("Held out.", "留出。")])
    test = _corpus(tmp_path / "test.tsv", [("Test.", "测试。")])
    data = DataConfig(corpus=_corpus(tmp_path / "c.tsv", pairs), valid_corpus=valid, test_corpus=test, filters=ALL_ON)
    split = split_corpus(data, ReadReport())
    train = list(split.train_pairs())
    assert split.read == len(pairs) and len(train) == split.train_count
    expected = [p for i, p in enumerate(pairs) if i != 30 and p != NOISE["markup"] and p != clean[7]]
    assert train == expected, "the second copy of a pair, the markup and the held-out source are gone"
    assert split.removals.counts == {"duplicates": 1, "markup": 1, "held out": 1}
    assert split.removals.examples["duplicates"] == [(31, None)]
    assert split.removals.examples["markup"] == [(32, NOISE["markup"])]
    by_source = split_corpus(
        DataConfig(corpus=data.corpus, valid_corpus=valid, test_corpus=test, filters=FiltersConfig(duplicates="source"))
    )
    assert by_source.removals.counts == {"duplicates": 2}, "a second translation of a source goes too"


def test_max_pairs_samples_among_the_pairs_the_filters_keep(tmp_path):
    pairs = [(f"Sentence {i}.", f"句子{i}。") for i in range(40)] + [NOISE["markup"]] * 20
    data = DataConfig(
        corpus=_corpus(tmp_path / "c.tsv", pairs), valid_size=2, test_size=2, max_pairs=30, filters=ALL_ON
    )
    split = split_corpus(data)
    assert split.train_count + len(one_way(split.valid)) + len(one_way(split.test)) == 30
    assert NOISE["markup"] not in list(split.train_pairs())


def test_removals_summarise_by_rule():
    removals = Removals()
    removals.add("copies", 3, ("a", "a"))
    removals.add_lines("duplicates", [5, 9], 2)
    assert removals.summary(100) == "filters removed 3 of 100 pairs: duplicates 2, copies 1"


def test_a_corpus_whose_scripts_disagree_with_its_languages_is_warned_about():
    from attn_cli.data.filters import languages_disagree

    pairs = [(f"Sentence {i}.", f"句子{i}。") for i in range(20)]
    assert languages_disagree(pairs, ("en", "zh")) is None
    assert "targets are not written in the script of data.tgt_lang=de" in languages_disagree(pairs, ("en", "de"))
    assert "sides look swapped" in languages_disagree([(t, s) for s, t in pairs], ("en", "zh"))
    assert languages_disagree(pairs, ("en", "xx")) is None, "a language whose script is unknown is not judged"


def test_a_score_column_removes_the_pairs_below_min_score_and_refuses_a_score_that_is_no_number(tmp_path):
    clean = [(f"Sentence {i}.", f"句子{i}。") for i in range(40)]
    lines = [f"{s}\t{t}\t{0.1 if i % 4 == 0 else 0.9}\n" for i, (s, t) in enumerate(clean)]
    lines[5] = f"{clean[5][0]}\t{clean[5][1]}\thigh\n"
    path = tmp_path / "scored.tsv"
    path.write_text("".join(lines), encoding="utf-8")
    report = ReadReport()
    data = DataConfig(corpus=CorpusConfig(path=str(path), score_column=2, min_score=0.5), valid_size=2, test_size=2)
    split = split_corpus(data, report)
    kept = set(list(split.train_pairs()) + one_way(split.valid) + one_way(split.test))
    assert kept == {pair for i, pair in enumerate(clean) if i % 4 != 0 and i != 5}
    assert split.removals.counts == {"score": 10}
    assert report.reasons == {"column 2 (score_column) is 'high', not a number": 1}

    jsonl = tmp_path / "scored.jsonl"
    records = [{"en": s, "zh": t, "score": 0.1 if i % 4 == 0 else 0.9} for i, (s, t) in enumerate(clean)]
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    scored = CorpusConfig(format="jsonl", path=str(jsonl), score_field="score", min_score=0.5)
    split = split_corpus(DataConfig(corpus=scored, valid_size=2, test_size=2))
    assert split.removals.counts == {"score": 10}


@pytest.mark.parametrize(
    ("corpus", "key"),
    [
        ({"path": "a.tsv", "min_score": 0.5}, "data.corpus.min_score"),
        ({"path": "a.tsv", "score_column": 1}, "data.corpus.score_column"),
        ({"path": "a.tsv", "score_field": "score"}, "data.corpus.score_field"),
    ],
)
def test_a_score_setting_without_its_scores_is_refused(corpus, key):
    from attn_cli.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError) as error:
        config_from_dict({"data": {"corpus": corpus}})
    assert error.value.key == key


def test_prepare_shows_the_removed_pairs_it_is_asked_for_and_again_from_the_prepared_data(tmp_path):
    from support.runs import REPO
    from typer.testing import CliRunner

    from attn_cli.cli.app import app

    clean = [(f"Sentence number {i}.", f"句子{i}。") for i in range(200)]
    copies = [(f"Copy {i}.", f"copy {i}.") for i in range(8)]
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"{s}\t{t}\n" for s, t in clean + copies), encoding="utf-8")
    settings = [f"data.corpus.path={corpus}", "data.src_lang=en", "data.tgt_lang=zh", "data.filters.copies=true"]
    settings += [f"run_dir={tmp_path / 'run'}", "tokenizer.vocab_size=300", "data.max_pairs=null"]
    args = ["prepare", "--config", str(REPO / "configs" / "tiny.yaml")] + [p for s in settings for p in ("--set", s)]
    first = CliRunner().invoke(app, [*args, "--show-removed", "5"])
    assert first.exit_code == 0, first.output
    shown = [line for line in first.output.splitlines() if line.strip().startswith("copies, e.g.")]
    assert shown and all(line.count("→") == 5 for line in shown)  # as prepared, and in the summary
    again = CliRunner().invoke(app, [*args, "--show-removed", "2"])
    assert "reusing" in again.output
    shown = [line for line in again.output.splitlines() if line.strip().startswith("copies, e.g.")]
    assert len(shown) == 1 and shown[0].count("→") == 2 and "'Copy 0.' → 'copy 0.'" in shown[0]
    hidden = CliRunner().invoke(app, [*args, "--show-removed", "0"])
    assert "copies, e.g." not in hidden.output and "8 copies" in hidden.output
