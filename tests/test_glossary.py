"""Glossaries: reading, which terms apply to a sentence, and term accuracy; `attn eval --glossary`."""

import shutil

import pytest
from typer.testing import CliRunner

from attn_cli.cli.app import app
from attn_cli.decoding.glossary import GlossaryError, Term, applicable_terms, read_glossary, term_accuracy


def test_a_glossary_gathers_alternatives_and_names_a_bad_line(tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("# product names\nmachine learning\t机器学习\n\nMachine Learning\t机器学习\t机械学习\nTom\t汤姆\n")
    assert read_glossary(path) == [Term("machine learning", ("机器学习", "机械学习")), Term("Tom", ("汤姆",))]
    path.write_text("cat\t猫\ndog 狗\n")
    with pytest.raises(GlossaryError, match=r"terms.tsv:2: 'dog 狗' is not SOURCE<TAB>TARGET"):
        read_glossary(path)
    path.write_text("cat\t\n")
    with pytest.raises(GlossaryError, match=r"terms.tsv:1:"):
        read_glossary(path)


def test_terms_apply_case_aside_on_word_boundaries_longest_first():
    terms = [Term("machine", ("机器",)), Term("machine learning", ("机器学习",)), Term("cat", ("猫",))]
    found = applicable_terms("Machine learning is not a category of cats or a cat.", terms, "en")
    assert found == [terms[1], terms[2]], "longest first; 'category' and 'cats' are not 'cat'"
    assert applicable_terms("A machine, and machine learning.", terms, "en") == [terms[0], terms[1]]
    chinese = [Term("机器", ("machine",)), Term("学习", ("learning",))]
    assert applicable_terms("我喜欢机器学习。", chinese, "zh") == chinese, "no word boundaries without spaces"


def test_term_accuracy_counts_the_terms_met_once_per_sentence():
    terms = [Term("machine learning", ("机器学习", "机械学习")), Term("Tom", ("汤姆",))]
    sources = ["I love machine learning.", "Tom and Tom like machine learning.", "No terms here."]
    outputs = ["我爱机械学习。", "汤姆喜欢学习。", "这里没有。"]
    score = term_accuracy(sources, outputs, terms, "en", "zh")
    # 1: met by an alternative; 2: Tom met (once, though twice in the source), machine learning missed.
    assert (score.applied, score.met, score.sentences_with_terms, score.sentences) == (3, 2, 2, 3)
    assert "66.67%" in str(score)
    spaced = term_accuracy(["A cat.", "A cat."], ["Un category.", "Un cat!"], [Term("cat", ("cat",))], "en", "fr")
    assert (spaced.applied, spaced.met) == (2, 1), "a spaced target is met on word boundaries only"


def test_attn_eval_reports_term_accuracy_of_its_translations(trained_run, tmp_path):
    trained_run = shutil.copytree(trained_run, tmp_path / "run")  # eval writes its hypotheses there
    sources = (trained_run / "data" / "test.en").read_text(encoding="utf-8").splitlines()[:20]
    references = (trained_run / "data" / "test.zh").read_text(encoding="utf-8").splitlines()[:20]
    (tmp_path / "src.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "ref.zh").write_text("\n".join(references) + "\n", encoding="utf-8")
    (tmp_path / "terms.tsv").write_text("Tom\t汤姆\nI\t我\n", encoding="utf-8")
    args = ["eval", "--run", trained_run, "--src", tmp_path / "src.en", "--ref", tmp_path / "ref.zh"]
    result = CliRunner().invoke(app, [str(a) for a in [*args, "--glossary", tmp_path / "terms.tsv", "--beam", "1"]])
    assert result.exit_code == 0, result.output
    hypotheses = next(trained_run.joinpath("checkpoints").glob("*src.en.hyp")).read_text(encoding="utf-8")
    expected = term_accuracy(sources, hypotheses.splitlines(), read_glossary(tmp_path / "terms.tsv"), "en", "zh")
    assert expected.applied > 0 and str(expected) in result.output
    (tmp_path / "terms.tsv").write_text("Tom 汤姆\n", encoding="utf-8")
    bad = CliRunner().invoke(app, [str(a) for a in [*args, "--glossary", tmp_path / "terms.tsv"]])
    assert bad.exit_code == 2 and "terms.tsv:1:" in bad.output
