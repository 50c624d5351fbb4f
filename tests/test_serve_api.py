"""attn serve's two APIs in process: the LibreTranslate API answers what attn translate gives, in
LibreTranslate's shapes; /v1 adds n-best lists, scores, confidence, alignment and attention."""

import dataclasses
import math

import pytest
import torch
from support.serving import SENTENCES, reference, server_of

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from attn_cli.serving.app import create_app  # noqa: E402


def _texts(translation):
    return [candidate.text for candidate in translation.candidates]


@pytest.fixture(scope="module")
def served(served_checkpoint):
    server = server_of(served_checkpoint)
    with TestClient(create_app(server)) as client:
        yield server, client


def test_translate_answers_what_attn_translate_gives(served):
    server, client = served
    expected = [t.text for t in reference(server, SENTENCES)]
    assert any(expected), "the random model should say something"
    for sentence, translation in zip(SENTENCES, expected):
        answer = client.post("/translate", json={"q": sentence, "source": "en", "target": "zh"})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"translatedText": translation}
    as_list = client.post("/translate", json={"q": SENTENCES, "source": "en", "target": "zh"}).json()
    assert as_list == {"translatedText": expected}


def test_form_fields_answer_as_json_does(served):
    _, client = served
    form = client.post("/translate", data={"q": SENTENCES[0], "source": "en", "target": "zh-Hans"})
    json_body = client.post("/translate", json={"q": SENTENCES[0], "source": "en", "target": "zh"})
    assert form.status_code == 200 and form.json() == json_body.json()


def test_lines_are_translated_one_by_one(served):
    server, client = served
    expected = [t.text for t in reference(server, SENTENCES[:2])]
    answer = client.post("/translate", json={"q": "\n".join(SENTENCES[:2]), "source": "en", "target": "zh"})
    assert answer.json()["translatedText"] == "\n".join(expected)


def test_auto_source_and_alternatives_are_the_n_best(served):
    server, client = served
    best = reference(server, SENTENCES[:1], n_best=3, beam_size=5)[0]
    answer = client.post("/translate", json={"q": SENTENCES[0], "source": "auto", "target": "zh", "alternatives": 2})
    detected = answer.json().pop("detectedLanguage")
    assert answer.json() | {"detectedLanguage": detected} == {
        "translatedText": best.text,
        "alternatives": _texts(best)[1:3],
        "detectedLanguage": detected,
    }
    assert detected["language"] == "en" and 50 < detected["confidence"] <= 100


def test_languages_and_detect(served):
    _, client = served
    assert client.get("/languages").json() == [
        {"code": "en", "name": "English", "targets": ["zh"]},
        {"code": "zh", "name": "Chinese", "targets": []},
    ]
    (found,) = client.post("/detect", data={"q": "hello, how are you?"}).json()  # the served sources only
    assert found["language"] == "en" and 50 < found["confidence"] <= 100
    # A text in a language the server does not translate from is refused by name, to /detect and to auto.
    for path, body in (
        ("/detect", {"q": "你好，世界"}),
        ("/translate", {"q": "你好，世界", "source": "auto", "target": "zh"}),
    ):
        refused = client.post(path, json=body)
        assert refused.status_code == 400
        assert "Chinese (zh" in refused.json()["error"] and "translates from English (en)" in refused.json()["error"]


def test_html_keeps_tags_and_translates_the_text_between(served):
    server, client = served
    document = (
        '<p class="intro" data-x="1">sentence number 3 <b>number 5</b></p>'
        "<script>var s = 'sentence number 3';</script><code>number 5</code>"
    )
    first, second = (t.text for t in reference(server, ["sentence number 3", "number 5"]))
    answer = client.post("/translate", json={"q": document, "source": "en", "target": "zh", "format": "html"})
    assert answer.json()["translatedText"] == (
        f'<p class="intro" data-x="1">{first} <b>{second}</b></p>'
        "<script>var s = 'sentence number 3';</script><code>number 5</code>"
    )


def test_v1_options_are_the_cli_s(served):
    server, client = served
    options = {"beam_size": 4, "n_best": 3, "length_penalty": 1.0, "max_len_b": 6}
    expected = reference(server, SENTENCES[:2], **options)
    answer = client.post("/v1/translate", json={"q": "\n".join(SENTENCES[:2]), **options}).json()
    sentences = answer["translations"][0]["sentences"]
    assert [s["translation"] for s in sentences] == [t.text for t in expected]
    for sentence, translation in zip(sentences, expected):
        assert [n["translation"] for n in sentence["n_best"]] == _texts(translation)
        assert [n["score"] for n in sentence["n_best"]] == pytest.approx(
            [c.score for c in translation.candidates], abs=1e-4
        )
        assert [n["tokens"] for n in sentence["n_best"]] == [c.tokens for c in translation.candidates]


def test_v1_n_best_beyond_the_model_s_beam_widens_the_beam(served):
    """An n-best list longer than the model's beam, without a beam_size, is searched by a beam as wide as the list."""
    server, client = served
    default_beam = next(iter(server.models)).engine.config.decode.beam_size
    n_best = default_beam + 2
    expected = reference(server, SENTENCES[:1], beam_size=n_best, n_best=n_best)[0]
    answer = client.post("/v1/translate", json={"q": SENTENCES[0], "n_best": n_best})
    assert answer.status_code == 200, answer.text
    assert [n["translation"] for n in answer.json()["translations"][0]["sentences"][0]["n_best"]] == _texts(expected)
    assert len(_texts(expected)) == n_best


def test_v1_prefix_and_sampling_follow_the_cli(served):
    server, client = served
    expected = reference(server, SENTENCES[:1], prefixes=["句子"], beam_size=1)[0].text
    answer = client.post("/v1/translate", json={"q": SENTENCES[0], "beam_size": 1, "prefix": "句子"}).json()
    assert answer["translations"][0]["translation"] == expected and expected.startswith("句子")
    sampled = _texts(reference(server, SENTENCES[:1], sample=True, seed=7, n_best=2)[0])
    answer = client.post("/v1/translate", json={"q": SENTENCES[0], "sample": True, "seed": 7, "n_best": 2}).json()
    assert [n["translation"] for n in answer["translations"][0]["sentences"][0]["n_best"]] == sampled


def test_v1_glossary_is_what_attn_translate_does_with_it(served):
    server, client = served
    from attn_cli.decoding.glossary import Term

    terms = [Term("number", ("号", "句子")), Term("sentence", ("7",))]
    expected = reference(server, SENTENCES, glossaries=[terms] * len(SENTENCES), beam_size=3, n_best=2)
    body = {"q": SENTENCES, "beam_size": 3, "n_best": 2, "glossary": [["number", "号", "句子"], ["sentence", "7"]]}
    answer = client.post("/v1/translate", json=body)
    assert answer.status_code == 200, answer.text
    sentences = [t["sentences"][0] for t in answer.json()["translations"]]
    assert [[n["translation"] for n in s["n_best"]] for s in sentences] == [_texts(t) for t in expected]
    assert [s["terms"] for s in sentences] == [t.terms for t in expected] and all(s["terms"] for s in sentences)
    assert all(not s["unmet_terms"] for s in sentences)
    assert all("7" in n["translation"] for s in sentences for n in s["n_best"] if "sentence" in s["terms"])
    for bad, problem in [
        ({"glossary": [["number"]]}, "glossary[0]: ['number'] is not a list of two or more non-empty strings"),
        (
            {"glossary": [["number", "号"]], "beam_size": 1},
            "glossary: terms are placed by beam search, and greedy search (beam 1) cannot place them; "
            "set beam_size to 2 or more and sample to false",
        ),
    ]:
        refused = client.post("/v1/translate", json={"q": SENTENCES[0], **bad})
        assert refused.status_code == 400 and problem in refused.json()["error"], refused.text


def test_confidence_is_the_geometric_mean_of_the_chosen_tokens_probabilities(served):
    """exp(log P / chosen tokens): the EOS counted, a forced prefix not (it was given, not chosen);
    the length-normalised score would give another number."""
    server, client = served
    for extra in ({}, {"prefix": "句子"}):
        answer = client.post("/v1/translate", json={"q": SENTENCES[2], "beam_size": 1, **extra}).json()
        sentence = answer["translations"][0]["sentences"][0]
        from attn_cli.decoding.parts import split_sources
        from attn_cli.decoding.records import Source

        engine = next(iter(server.models)).engine
        options = dataclasses.replace(engine.config.decode, beam_size=1)
        prefixes = [extra["prefix"]] if extra else None
        (prepared,) = split_sources(engine, [Source(SENTENCES[2], extra.get("prefix", ""))], options)
        best = engine.searcher(options)(prepared.parts)[0][0]  # the one part's best hypothesis
        given = len(engine.tokenizers.target.encode(prefixes)[0]) if extra else 0
        chosen = len(best.tokens) + 1 - given
        assert sentence["confidence"] == pytest.approx(math.exp(best.log_prob / chosen), rel=1e-5)
        assert sentence["confidence"] != pytest.approx(math.exp(sentence["score"]), rel=1e-3)


def test_alignment_and_attention_have_the_tokens_shapes(served):
    _, client = served
    answer = client.post("/v1/translate", json={"q": SENTENCES[3], "alignment": True, "attention": True}).json()
    sentence = answer["translations"][0]["sentences"][0]
    attention = sentence["attention"]
    sources, outputs = attention["source_tokens"], attention["output_tokens"]
    assert sources[-1] == "</s>" and outputs[-1] == "</s>" and attention["decoder_input_tokens"][0] == "<s>"
    cross = torch.tensor(attention["cross"])  # (layers, heads, outputs, sources)
    assert cross.shape[2:] == (len(outputs), len(sources))
    assert torch.allclose(cross.sum(-1), torch.ones(cross.shape[:3]), atol=1e-3)
    decoder_self = torch.tensor(attention["decoder_self"])
    assert torch.all(decoder_self.triu(diagonal=1) == 0), "the decoder's self-attention is causal"
    # each output token (EOS aside) aligned with the source token (EOS aside) it attends to most
    mean = cross[-1].mean(0)[:-1, :-1]  # from weights rounded to 4 decimals: a near tie may go either way
    assert [t for t, _ in sentence["alignment"]] == list(range(len(outputs) - 1))
    for t, s in sentence["alignment"]:
        assert mean[t, s] >= mean[t].max() - 1e-4
    assert sentence["tokens"] == {"source": sources[:-1], "target": outputs[:-1]}


def test_models_health_and_openapi(served):
    _, client = served
    models = client.get("/v1/models").json()["models"]
    assert [(m["name"], m["backend"], m["attention"]) for m in models] == [("en-zh", "pytorch", True)]
    assert client.get("/health").json()["status"] == "ok"
    schema = client.get("/openapi.json").json()
    fields = schema["components"]["schemas"]["TranslateRequest"]["properties"]
    from attn_cli.decoding.options import DECODE_OPTIONS

    assert {o.key for o in DECODE_OPTIONS} - {"max_tokens"} <= set(fields), "every decoding option is a field"
    assert "max_tokens" not in fields, "the batch budget is the server's"


def test_the_page_and_the_api_docs_load_nothing_from_elsewhere(served):
    """Users run this offline: every file the page serves is the package's, with no outside URL."""
    import re

    from attn_cli.serving.app import PAGE_FILES

    _, client = served
    assert "openapi.json" in client.get("/docs").text
    for name in PAGE_FILES:
        served_file = client.get("/" if name == "index.html" else f"/page/{name}")
        assert served_file.status_code == 200, name
        assert not re.search(
            r"(src|href)\s*=\s*[\"']?(https?:)?//|url\(\s*[\"']?(https?:)?//|import\s", served_file.text
        )
        assert not re.search(r"fetch\(\s*[\"'`]https?:", served_file.text), name


def _corpus_pairs(count: int = 300) -> list[tuple[str, str]]:
    """Every 97th pair of the built-in corpus, `count` of them: sentences of every length."""
    import lzma

    from support.runs import REPO

    lines = lzma.decompress((REPO / "attn_cli/corpora/tatoeba-cmn-eng/cmn.txt.xz").read_bytes()).decode("utf-8-sig")
    pairs = [tuple(line.split("\t")[:2]) for line in lines.splitlines() if "\t" in line]
    return pairs[::97][:count]


CORPUS_PAIRS = _corpus_pairs()


@pytest.mark.slow  # two models loaded and served
def test_several_language_pairs_are_served_side_by_side(served_checkpoint, tmp_path):
    """--run A --run B: each request goes to the model of its pair, and translates as that model alone."""
    import dataclasses as dc

    from attn_cli.checkpoint import load_checkpoint, save_checkpoint
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine
    from attn_cli.serving.models import ServedModels
    from attn_cli.serving.server import Server

    original = load_checkpoint(served_checkpoint)
    torch.manual_seed(1)
    for parameter in original.model.parameters():  # another model, the other way round
        parameter.data.add_(torch.randn_like(parameter) * 0.5)
    reverse_config = dc.replace(original.config, data=dc.replace(original.config.data, src_lang="zh", tgt_lang="en"))
    save_checkpoint(tmp_path / "zh-en.pt", reverse_config, original.tokenizers, original.model, step=1, epoch=1)
    loaded = [load_engine([], [path], None, "cpu") for path in (served_checkpoint, tmp_path / "zh-en.pt")]
    server = Server(ServedModels(loaded))
    with TestClient(create_app(server)) as client:
        assert [(lang["code"], lang["targets"]) for lang in client.get("/languages").json()] == [
            ("en", ["zh"]),
            ("zh", ["en"]),
        ]
        chinese = "句子3号"
        for text, source, target, model in (
            (SENTENCES[0], "en", "zh", 0),
            (chinese, "zh", "en", 1),
            (chinese, "auto", "en", 1),  # detected as Chinese
            (SENTENCES[0], "auto", "zh", 0),
        ):
            answer = client.post("/translate", json={"q": text, "source": source, "target": target}).json()
            assert (
                answer["translatedText"]
                == translate(loaded[model], [Source(text)], loaded[model].config.decode)[0].text
            )
        assert client.post("/translate", json={"q": "x", "source": "en", "target": "en"}).status_code == 400
        # /detect tells the two served sources apart on the built-in corpus's sentences, short ones included
        for column, language in ((0, "en"), (1, "zh")):
            found = [client.post("/detect", json={"q": pair[column]}).json()[0]["language"] for pair in CORPUS_PAIRS]
            assert found.count(language) >= 0.95 * len(found), (language, found.count(language))
        named = client.post("/v1/translate", json={"q": SENTENCES[0], "model": "zh-en"}).json()
        assert named["model"] == "zh-en"
        assert "several models" in client.post("/v1/translate", json={"q": SENTENCES[0]}).json()["error"]


def test_a_ctranslate2_export_is_served_as_attn_translate_model_decodes_it(served_checkpoint, tmp_path):
    pytest.importorskip("ctranslate2")
    from attn_cli.checkpoint import load_checkpoint
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine
    from attn_cli.export.convert import export
    from attn_cli.serving.models import ServedModels
    from attn_cli.serving.server import Server

    checkpoint = load_checkpoint(served_checkpoint)
    export(checkpoint.config, checkpoint.tokenizers, checkpoint.model, tmp_path / "exported", "float32")
    loaded = load_engine([], [], tmp_path / "exported", "cpu")
    assert loaded.capabilities.backend == "ctranslate2"
    expected = [t.text for t in translate(loaded, [Source(s) for s in SENTENCES], loaded.config.decode)]
    with TestClient(create_app(Server(ServedModels([loaded])))) as client:
        answer = client.post("/translate", json={"q": SENTENCES, "source": "en", "target": "zh"})
        assert answer.json() == {"translatedText": expected}
        assert client.get("/v1/models").json()["models"][0]["backend"] == "ctranslate2"
        refused = client.post("/v1/translate", json={"q": SENTENCES[0], "alignment": True})
        assert refused.status_code == 400 and "ctranslate2" in refused.json()["error"]
        assert refused.json()["error"].startswith("attention: CTranslate2 gives no one model's attention weights")
        assert "prefix" in client.post("/v1/translate", json={"q": SENTENCES[0], "prefix": "句子"}).json()["error"]


@pytest.mark.slow  # two parts of some 160 tokens each, decoded twice
def test_a_sentence_longer_than_the_model_takes_is_split(served):
    server, client = served
    long_line = " ".join(f"sentence number {i}," for i in range(60))  # some 240 tokens: more than 159
    expected = reference(server, [long_line])[0]
    assert [note.kind for note in expected.notes] == ["split"] and "parts" in expected.notes[0].message
    answer = client.post("/v1/translate", json={"q": long_line}).json()["translations"][0]["sentences"][0]
    assert answer["translation"] == expected.text
    assert answer["notes"] == [{"kind": note.kind, "message": note.message} for note in expected.notes]


def test_v1_sentences_are_the_lines_attn_translate_writes(served, served_checkpoint, tmp_path):
    """Served = the command line: each /v1 sentence is, field for field, the JSONL line that
    `attn translate --format jsonl` writes for the same source, prefix, glossary and options."""
    import json

    from typer.testing import CliRunner

    from attn_cli.cli.app import app

    _, client = served
    prefixes = ["", "句子", "", "句"]
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(
        "".join(json.dumps({"source": s, "prefix": p}, ensure_ascii=False) + "\n" for s, p in zip(SENTENCES, prefixes)),
        encoding="utf-8",
    )
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("number\t号\t句子\n", encoding="utf-8")
    options = ["--beam", "3", "--n-best", "2", "--length-penalty", "1.0", "--device", "cpu"]
    result = CliRunner().invoke(
        app,
        ["translate", "--checkpoint", str(served_checkpoint), "--input", str(inputs), "--input-format", "jsonl"]
        + ["--format", "jsonl", "--glossary", str(glossary), *options],
    )
    assert result.exit_code == 0, result.output
    written = [json.loads(line) for line in result.stdout.splitlines()]
    body = {"q": "\n".join(SENTENCES), "prefix": prefixes, "glossary": [["number", "号", "句子"]]}
    answer = client.post("/v1/translate", json={**body, "beam_size": 3, "n_best": 2, "length_penalty": 1.0})
    assert answer.status_code == 200, answer.text
    assert answer.json()["translations"][0]["sentences"] == written
    assert any(line.get("terms") for line in written) and any(line.get("prefix") for line in written)


def test_frontend_settings_answer_what_libretranslate_web_front_ends_read(served):
    server, client = served
    settings = client.get("/frontend/settings").json()
    assert settings["charLimit"] == server.limits.max_characters
    assert (settings["apiKeys"], settings["keyRequired"]) == (False, False)
    assert settings["language"] == {
        "source": {"code": "en", "name": "English"},
        "target": {"code": "zh", "name": "Chinese"},
    }
