"""Glossaries: reading, which terms apply to a sentence, and term accuracy; `attn eval --glossary`."""

import os
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
    args = ["eval", "--run", trained_run, "--src", tmp_path / "src.en", "--ref", tmp_path / "ref.zh", "--beam", "3"]
    hypotheses_file = trained_run / "checkpoints" / "best.src.en.hyp"
    plain = CliRunner().invoke(app, [str(a) for a in args])
    assert plain.exit_code == 0, plain.output
    unaided = hypotheses_file.read_text(encoding="utf-8").splitlines()
    result = CliRunner().invoke(app, [str(a) for a in [*args, "--glossary", tmp_path / "terms.tsv"]])
    assert result.exit_code == 0, result.output
    hypotheses = hypotheses_file.read_text(encoding="utf-8").splitlines()
    terms = read_glossary(tmp_path / "terms.tsv")
    aided, without = (
        term_accuracy(sources, hypotheses, terms, "en", "zh"),
        term_accuracy(sources, unaided, terms, "en", "zh"),
    )
    assert aided.applied > 0 and aided.share == 1.0 and without.share < 1.0
    with_part, without_part = result.output.split("without the glossary:")
    assert str(aided) in with_part
    # The scores "without" are those of attn eval without the glossary.
    plain_scores = [line for line in plain.output.splitlines() if line.startswith(("BLEU", "chrF"))]
    assert plain_scores and all(f"  {line}" in without_part for line in plain_scores)
    assert str(without) in without_part
    refused = CliRunner().invoke(app, [str(a) for a in [*args, "--glossary", tmp_path / "terms.tsv", "--beam", "1"]])
    assert refused.exit_code == 2, refused.output
    assert "--glossary: terms are placed by beam search, and greedy search (beam 1) cannot place them" in refused.output
    assert "use --beam 2 or more" in refused.output
    (tmp_path / "terms.tsv").write_text("Tom 汤姆\n", encoding="utf-8")
    bad = CliRunner().invoke(app, [str(a) for a in [*args, "--glossary", tmp_path / "terms.tsv"]])
    assert bad.exit_code == 2 and "terms.tsv:1:" in bad.output


def _loaded(run):
    from attn_cli.engines.load import load_engine

    return load_engine([run], [], None, "cpu")


def _options(engine, **settings):
    from attn_cli.decoding.options import override_decode

    return override_decode(engine.config.decode, {"beam_size": 4, "n_best": 3, **settings})


def translate(engine, sentences, options, glossaries=None):
    """The pipeline's translations of `sentences`, each with the terms of its glossary when given."""
    from support.decoding import sources_of

    from attn_cli.decoding.pipeline import translate

    return translate(engine, sources_of(sentences, glossaries=glossaries), options)


def _with_and_without_terms(engine, sentences, options, glossaries):
    """The translations with the glossaries, and what the search without them gave (its first search,
    as `attn eval --glossary` reports it)."""
    from support.decoding import sources_of

    from attn_cli.decoding.parts import split_sources
    from attn_cli.decoding.pipeline import assemble, decode

    prepared = split_sources(engine, sources_of(sentences, glossaries=glossaries), options)
    decoded = decode(engine, prepared, options)
    return assemble(engine, prepared, decoded.outputs, options), assemble(engine, prepared, decoded.first, options)


def _texts(translation):
    return [candidate.text for candidate in translation.candidates]


def _test_sentences(run, count=16):
    return (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()[:count]


def _holds(text, term):
    return any(target in text for target in term.targets)


GLOSSARY = [Term("Tom", ("汤姆",)), Term("I", ("我",)), Term("you", ("你", "您")), Term("is", ("是",))]


def test_every_translation_of_the_n_best_holds_every_term_that_applies(trained_run):
    loaded = _loaded(trained_run)
    sentences = _test_sentences(trained_run)
    options = _options(loaded)
    plain = translate(loaded, sentences, options)
    aided, unaided = _with_and_without_terms(loaded, sentences, options, [GLOSSARY] * len(sentences))
    assert aided == translate(loaded, sentences, options, glossaries=[GLOSSARY] * len(sentences))
    missed = 0
    for sentence, before, after, first in zip(sentences, plain, aided, unaided):
        applied = applicable_terms(sentence, GLOSSARY, "en")
        assert after.terms == [term.source for term in applied] and not after.unmet_terms
        assert all(_holds(text, term) for text in _texts(after) for term in applied)
        missed += not all(_holds(text, term) for text in _texts(before) for term in applied)
        assert first.text == before.text
    assert missed >= 3, "the test needs sentences whose terms the model leaves out unaided"


def test_terms_already_written_and_an_empty_glossary_leave_the_translations_unchanged(trained_run):
    loaded = _loaded(trained_run)
    sentences = _test_sentences(trained_run, 8)
    options = _options(loaded, n_best=1, length_penalty=2.0)  # this tiny model ends at once without it
    plain = translate(loaded, sentences, options)
    unchanged = translate(loaded, sentences, options, glossaries=[[]] * 8)
    assert [_texts(t) for t in unchanged] == [_texts(t) for t in plain]
    # Each sentence's glossary: its first word, and as target the end of what the model writes for it.
    written = [[Term(s.split()[0], (t.text[-3:],))] if t.text else [] for s, t in zip(sentences, plain)]
    assert sum(map(bool, written)) >= 6
    aided = translate(loaded, sentences, options, glossaries=written)
    assert [_texts(t) for t in aided] == [_texts(t) for t in plain]
    assert all(t.terms for t, terms in zip(aided, written) if terms)


def test_any_one_alternative_of_a_term_satisfies_it(trained_run):
    loaded = _loaded(trained_run)
    sentences = [s for s in _test_sentences(trained_run, 40) if " " in s][:6]
    options = _options(loaded, n_best=2)
    terms = [[Term(s.split()[0], ("汤姆", "猫"))] for s in sentences]
    for translation, glossary in zip(translate(loaded, sentences, options, glossaries=terms), terms):
        assert all("汤姆" in text or "猫" in text for text in _texts(translation))


def test_a_term_that_cannot_fit_is_named_in_the_json_output(trained_run, tmp_path):
    import json

    (tmp_path / "terms.tsv").write_text("Tom\t汤姆汤姆汤姆汤姆汤姆汤姆汤姆汤姆汤姆汤姆\n", encoding="utf-8")
    lines = [
        json.dumps({"source": "Tom is here."}),
        json.dumps({"source": "I see you.", "glossary": [["you", "你们", "您"]]}),
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["translate", "--run", trained_run, "--glossary", tmp_path / "terms.tsv", "--input-format", "jsonl"]
    args += ["--input", tmp_path / "in.jsonl", "--format", "jsonl", "--max-len-a", "0", "--max-len-b", "4", "-b", "3"]
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records[0]["terms"] == ["Tom"] and records[0]["unmet_terms"] == ["Tom"]
    (note,) = [note for note in records[0]["notes"] if note["kind"] == "unmet_terms"]
    assert "do not fit within the output limit" in note["message"]
    # The line's own glossary joins the file's; its terms are met.
    assert records[1]["terms"] == ["you"] and records[1]["unmet_terms"] == []
    assert not any(note["kind"] == "unmet_terms" for note in records[1]["notes"])
    assert any(t in records[1]["n_best"][0]["translation"] for t in ("你们", "您"))


def test_the_constrained_search_of_a_trained_model_equals_the_reference_search(trained_run):
    import torch
    from support.reference_search import reference_constrained_search

    from attn_cli.decoding.constrained import constrained_beam_search
    from attn_cli.decoding.glossary import token_alternatives
    from attn_cli.decoding.search import SearchSettings

    loaded = _loaded(trained_run)
    tokenizers, model = loaded.tokenizers, loaded.model
    sentences = _test_sentences(trained_run, 4)
    terms = [
        [token_alternatives(Term("x", ("汤姆",)), tokenizers.target, "zh")],
        [],
        [token_alternatives(Term("x", ("我", "你")), tokenizers.target, "zh")],
        [
            token_alternatives(Term("x", ("是",)), tokenizers.target, "zh"),
            token_alternatives(Term("y", ("猫",)), tokenizers.target, "zh"),
        ],
    ]
    rows = [ids + [3] for ids in tokenizers.encode_sources(sentences)]
    src = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    for row, ids in enumerate(rows):
        src[row, : len(ids)] = torch.tensor(ids)
    batched = constrained_beam_search(
        model, src, terms, SearchSettings(3, n_best=3, length_penalty=0.6, max_len_a=1.2, max_len_b=5)
    )
    for row, ids in enumerate(rows):
        reference = reference_constrained_search(model, torch.tensor(ids), terms[row], 3, 0.6, 1.2, 5, 3)
        assert [h.tokens for h in batched[row]] == [h.tokens for h in reference]
        assert [h.score for h in batched[row]] == pytest.approx([h.score for h in reference], abs=1e-4)


def test_the_kept_terminology_set_asks_only_for_what_its_references_say():
    from support.runs import REPO

    from attn_cli.decoding.glossary import occurs

    kept = REPO / "benchmarks" / "en-zh-terms"
    terms = read_glossary(kept / "glossary.tsv")
    sources = (kept / "test.en").read_text(encoding="utf-8").splitlines()
    references = (kept / "test.zh").read_text(encoding="utf-8").splitlines()
    credits = (kept / "test.attribution").read_text(encoding="utf-8").splitlines()
    assert len(sources) == len(references) == len(credits) > 300 and len(terms) > 50
    for source, reference in zip(sources, references):
        applied = applicable_terms(source, terms, "en")
        assert applied and all(any(occurs(reference, t, "zh") for t in term.targets) for term in applied)


def test_on_a_random_model_terms_already_written_leave_its_translations_unchanged(served_checkpoint):
    from support.serving import SENTENCES

    from attn_cli.engines.load import load_engine

    loaded = load_engine([], [served_checkpoint], None, "cpu")
    options = _options(loaded, n_best=2)
    plain = translate(loaded, SENTENCES, options)
    # A term of each sentence's first word, whose target is the start of both of its translations.
    written = []
    for sentence, translation in zip(SENTENCES, plain):
        shared = os.path.commonprefix(_texts(translation))[:3]
        written.append([Term(sentence.split()[0], (shared,))] if shared.strip() else [])
    assert sum(map(bool, written)) >= 2
    aided = translate(loaded, SENTENCES, options, glossaries=written)
    assert [_texts(t) for t in aided] == [_texts(t) for t in plain]
    # A term neither translation writes changes them, and both then hold it.
    absent = [[Term(sentence.split()[0], ("号号",))] for sentence in SENTENCES]
    forced = translate(loaded, SENTENCES, options, glossaries=absent)
    assert all("号号" in text for t in forced for text in _texts(t))


def _random_translator(seed: int, reverse: bool = False):
    """The pipeline over a random lively model with numbered_tokenizers (zh -> en when reversed)."""
    from support.decoding import engine_of, sources_of
    from support.models import lively_model
    from support.runs import numbered_tokenizers

    from attn_cli.data.tokenizer import Tokenizers
    from attn_cli.decoding.pipeline import translate

    tokenizers = numbered_tokenizers()
    if reverse:
        tokenizers = Tokenizers(tokenizers.target, tokenizers.source)
    vocab = tokenizers.source.vocab_size
    model = lively_model(seed, src_vocab_size=vocab, tgt_vocab_size=vocab)
    languages = ("zh", "en") if reverse else ("en", "zh")

    def translated(sentences, options, glossaries=None, max_source_tokens=60):
        engine = engine_of(model, tokenizers, max_source_tokens, languages[1], languages[0])
        return translate(engine, sources_of(sentences, glossaries=glossaries), options)

    return translated


def test_an_n_best_list_stays_full_when_few_outputs_can_hold_the_terms():
    from attn_cli.config import DecodeConfig

    translate = _random_translator(0)
    # no_loops off: the term itself writes one token three times over, which the rule forbids
    options = DecodeConfig(beam_size=3, n_best=3, max_len_a=0.0, max_len_b=3, no_loops=False)
    found = translate(["sentence number 1", "number 7"], options, [[Term("number", ("号号号",))]] * 2)
    for translation in found:
        assert len(translation.candidates) == 3 and "号号号" in translation.text


def test_with_n_best_a_best_translation_that_holds_the_terms_stays_the_best():
    from attn_cli.config import DecodeConfig

    checked = 0
    for seed in range(6):
        translate = _random_translator(seed)
        options = DecodeConfig(beam_size=4, n_best=3, max_len_b=6)
        sentences = ["sentence number 0", "sentence number 12", "number 5"]
        plain = translate(sentences, options)
        glossaries = []
        for translation in plain:
            best = translation.text
            # A piece of the best translation that one of the others lacks: the part is searched again.
            piece = next(
                (
                    best[i : i + 2]
                    for i in range(len(best) - 1)
                    if not all(best[i : i + 2] in t for t in _texts(translation))
                ),
                "",
            )
            glossaries.append([Term("number", (piece,))] if piece.strip() else [])
        aided = translate(sentences, options, glossaries)
        for before, after, terms in zip(plain, aided, glossaries):
            if terms:
                checked += 1
                assert after.text == before.text
                assert all(terms[0].targets[0] in text for text in _texts(after))
    assert checked >= 3


def test_a_truncated_input_applies_only_the_terms_of_what_is_translated():
    import dataclasses

    from attn_cli.config import DecodeConfig

    translate = _random_translator(1)
    options = dataclasses.replace(DecodeConfig(beam_size=3, max_len_b=6), long_inputs="truncate")
    sentence = "sentence sentence sentence sentence sentence sentence number 6"
    plain = translate([sentence], options, max_source_tokens=4)
    aided = translate([sentence], options, [[Term("6", ("号号",))]], max_source_tokens=4)
    assert [note.kind for note in plain[0].notes] == ["truncated"]
    assert aided[0].terms == [] and _texts(aided[0]) == _texts(plain[0])


def test_in_a_spaced_target_language_a_term_is_met_as_a_whole_word():
    from attn_cli.config import DecodeConfig
    from attn_cli.decoding.glossary import occurs

    translate = _random_translator(2, reverse=True)
    options = DecodeConfig(beam_size=4, n_best=2, max_len_b=8)
    sentences = [f"句子{i}号" for i in range(12)]
    found = translate(sentences, options, [[Term("号", ("number",))]] * len(sentences))
    assert all(occurs(text, "number", "en") for translation in found for text in _texts(translation))
    assert not any(translation.unmet_terms for translation in found)
