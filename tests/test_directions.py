"""A model of several directions: corpora read both ways, a target tag before each source, held-out
pairs scored in each direction, and the tag asked for the same way by translate, eval, the server
and the exports."""

import json

import numpy as np
import pytest
from support.runs import numbered_tokenizers, train_tiny
from typer.testing import CliRunner

from attn_cli.cli.app import app
from attn_cli.config import ConfigError, DataConfig, TrainingCorpus, config_from_dict
from attn_cli.data.split import split_corpus
from attn_cli.languages import Direction

BUILTIN = "builtin:tatoeba-cmn-eng"
BOTH_WAYS = f"data.corpora=[{{path: '{BUILTIN}', reverse: true}}]"
EN_ZH, ZH_EN = Direction("en", "zh"), Direction("zh", "en")


def cli(*args):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def test_a_corpus_read_both_ways_is_two_directions_with_a_tag_each():
    data = DataConfig(corpora=(TrainingCorpus(path=BUILTIN, reverse=True, name="tatoeba"),))
    assert data.directions == (EN_ZH, ZH_EN)
    assert data.target_tags == {"zh": ">>zh<<", "en": ">>en<<"}
    assert [(d.label, d.direction, d.reversed) for d in data.directed_corpora] == [
        ("tatoeba en-zh", EN_ZH, False),
        ("tatoeba zh-en", ZH_EN, True),
    ]
    one_way = DataConfig(corpora=(TrainingCorpus(path=BUILTIN),))
    assert one_way.directions == (EN_ZH,) and one_way.target_tags == {}
    # two corpora into one target language need no tag: the target is never in doubt
    into_english = DataConfig(
        corpora=(
            TrainingCorpus(path="de.tsv", src_lang="de", tgt_lang="en"),
            TrainingCorpus(path="zh.tsv", src_lang="zh", tgt_lang="en"),
        )
    )
    assert into_english.directions == (Direction("de", "en"), ZH_EN) and into_english.target_tags == {}
    assert data.direction_into("zh-Hans") == EN_ZH and data.direction_into(None) == EN_ZH
    with pytest.raises(ConfigError, match="does not translate into 'de'; it translates into zh, en"):
        data.direction_into("de")


def test_a_fixed_source_prefix_and_a_bad_language_code_are_refused():
    corpora = [{"path": BUILTIN, "reverse": True}]
    with pytest.raises(ConfigError, match="tokenizer.source_prefix: the corpora have 2 target languages"):
        config_from_dict({"data": {"corpora": corpora}, "tokenizer": {"source_prefix": ">>cmn_Hans<<"}})
    with pytest.raises(ConfigError, match=r"data.corpora\[0\].tgt_lang: 'zh en' is not a language code"):
        config_from_dict({"data": {"corpora": [{"path": BUILTIN, "tgt_lang": "zh en"}]}})


@pytest.fixture(scope="module")
def both_ways_split():
    data = DataConfig(
        corpora=(TrainingCorpus(path=BUILTIN, reverse=True),), max_pairs=3000, valid_size=100, test_size=100
    )
    return data, split_corpus(data)


def test_held_out_pairs_are_scored_both_ways_and_kept_out_of_both_directions(both_ways_split):
    data, split = both_ways_split
    for held_out in (split.valid, split.test):
        assert list(held_out) == [EN_ZH, ZH_EN]
        assert held_out[ZH_EN] == [(target, source) for source, target in held_out[EN_ZH]]
    held_out_sides = {side for pair in split.valid[EN_ZH] + split.test[EN_ZH] for side in pair}
    training = list(split.train_pairs())
    # neither direction trains on a held-out source: the English by the split's grouping, the Chinese
    # (the reverse direction's source) by the rule for corpora read both ways
    assert not [pair for pair in training if pair[0] in held_out_sides or pair[1] in held_out_sides]
    removed = split.reads[0].removals.counts.get("held out", 0)
    assert removed > 0, "the built-in corpus has Chinese sentences with several English ones"
    directed = list(split.directed_train_pairs())
    assert split.directed_train_counts() == [len(training), len(training)]
    assert directed == [(0, pair) for pair in training] + [(1, (pair[1], pair[0])) for pair in training]


def test_a_source_asks_for_its_target_by_the_tag_before_it():
    from attn_cli.config import TokenizerConfig
    from attn_cli.data.tokenizer import TokenizerError, Tokenizers, train_tokenizers

    base = numbered_tokenizers()
    english = [f"sentence number {i}" for i in range(200)]
    tokenizers = train_tokenizers(
        english,
        [f"句子{i}号" for i in range(200)],
        TokenizerConfig(vocab_size=300, character_coverage=1.0),
        tags=("<bt>",),
        target_tags={"zh": ">>zh<<", "en": ">>en<<"},
    )
    zh, en, bt = (tokenizers.source.piece_to_id(piece) for piece in (">>zh<<", ">>en<<", "<bt>"))
    plain = tokenizers.source.encode(["sentence number 7"])[0]
    assert tokenizers.source.id_to_piece(plain) == base.source.id_to_piece(base.source.encode(["sentence number 7"])[0])
    assert tokenizers.encode_sources(["sentence number 7"], "zh") == [[zh, *plain]]
    assert tokenizers.encode_sources(["<bt> sentence number 7"], "en") == [[en, bt, *plain]]
    # typed, as training and joining write it: the typed tag is read, and the asked-for one wins
    assert tokenizers.encode_sources([">>en<< sentence number 7"]) == [[en, *plain]]
    assert tokenizers.encode_sources([">>en<< sentence number 7"], "zh") == [[zh, *plain]]
    rows = tokenizers.encode_sources([">>en<< <bt> sentence number 7", ">>zh<< sentence number 8"])
    assert tokenizers.decode_sources(rows) == [">>en<< <bt> sentence number 7", ">>zh<< sentence number 8"]
    with pytest.raises(TokenizerError, match="this model translates into zh, en: say which"):
        tokenizers.encode_sources(["sentence number 7"])
    with pytest.raises(TokenizerError, match="does not translate into 'de'"):
        tokenizers.encode_sources(["sentence number 7"], "de")
    assert Tokenizers.from_state(tokenizers.to_state()).target_tags == tokenizers.target_tags


def test_joining_joins_pairs_of_one_target_language_with_its_separators():
    from attn_cli.config import TokenizerConfig
    from attn_cli.data.joining import JoinSettings, join_epoch
    from attn_cli.data.prepared import TokenizedPairs
    from attn_cli.data.tokenizer import train_tokenizers

    english, chinese = [f"sentence number {i}" for i in range(200)], [f"句子{i}号" for i in range(200)]
    tokenizers = train_tokenizers(
        english + chinese,
        chinese + english,
        TokenizerConfig(vocab_size=400, character_coverage=1.0),
        target_tags={"zh": ">>zh<<", "en": ">>en<<"},
    )
    sources = tokenizers.encode_sources([f">>zh<< {e}" for e in english] + [f">>en<< {c}" for c in chinese])
    targets = tokenizers.target.encode(chinese + english)
    base = TokenizedPairs.from_rows(
        [np.asarray(row, dtype=np.int32) for row in sources], [np.asarray(row, dtype=np.int32) for row in targets]
    )
    settings = JoinSettings(0.6, 3, 100, 100, " ", "", by_target={"zh": (" ", ""), "en": ("", " ")})
    epoch = join_epoch(base, tokenizers, settings, seed=1, epoch=1)
    assert epoch.joined_count > 50
    for i in range(len(epoch.singles), len(epoch)):
        example = epoch[i]
        source = tokenizers.decode_sources([example.src])[0]
        target = tokenizers.target.decode([example.tgt])[0]
        if source.startswith(">>zh<< "):  # English joined with spaces, Chinese with nothing
            assert "句" not in source and " " not in target and target.count("句") >= 2
        else:
            assert source.startswith(">>en<< ") and " " not in source.removeprefix(">>en<< ")
            assert "句" not in target and target.count("sentence") >= 2
        assert source.count(">>") == 1, source


@pytest.fixture(scope="module")
def both_ways_run(tmp_path_factory):
    """A tiny model of en-zh and zh-en, trained on the built-in corpus read both ways, in the shape
    Transformers' Marian represents (for the export)."""
    run = tmp_path_factory.mktemp("both-ways") / "run"
    result = train_tiny(
        run,
        "data.corpus=null",
        BOTH_WAYS,
        "train.max_steps=60",
        "train.valid_every=30",
        "train.join.rate=0.3",
        "model.norm=post",
        "model.sinusoid_layout=halves",
        "model.activation=silu",
        "model.output_bias=true",
        "decode.beam_size=2",
    )
    assert result.exit_code == 0, result.output
    return run


def test_validation_scores_each_direction_and_chooses_best_on_their_mean(both_ways_run):
    metrics = [json.loads(line) for line in (both_ways_run / "metrics.jsonl").read_text().splitlines()]
    validations = [m for m in metrics if "valid_bleu" in m]
    assert len(validations) == 2
    for found in validations:
        assert found["valid_bleu"] == pytest.approx((found["valid_bleu_en-zh"] + found["valid_bleu_zh-en"]) / 2)
    data = both_ways_run / "data"
    for split in ("valid", "test"):
        forward = (data / f"{split}.en-zh.en").read_text().splitlines()
        assert forward and forward == (data / f"{split}.zh-en.en").read_text().splitlines()
    assert not (data / "test.en").exists()


def test_translate_asks_for_the_target_and_refuses_without_one(both_ways_run):
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    chinese = (both_ways_run / "data" / "test.zh-en.zh").read_text().splitlines()[:5]
    english = (both_ways_run / "data" / "test.en-zh.en").read_text().splitlines()[:5]
    engine = load_engine([both_ways_run], [], None, "cpu")
    into_english = [t.text for t in translate(engine, [Source(s, target="en") for s in chinese], engine.config.decode)]
    into_chinese = [t.text for t in translate(engine, [Source(s, target="zh") for s in english], engine.config.decode)]
    lines = both_ways_run.parent / "chinese.txt"
    lines.write_text("\n".join(chinese) + "\n", encoding="utf-8")
    result = cli("translate", "--run", both_ways_run, "--target", "en", "--input", lines)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == into_english
    lines = [json.dumps({"source": s, "target": "en"}) for s in chinese] + [json.dumps({"source": s}) for s in english]
    path = both_ways_run.parent / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = cli(
        "translate", "--run", both_ways_run, "--input-format", "jsonl", "-i", path, "--format", "jsonl", "-t", "zh"
    )
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["translation"] for line in result.stdout.splitlines()] == into_english + into_chinese
    # the tag changes what the model reads: the same sentence asked both ways is translated twice
    ids = [engine.tokenizers.encode_sources([english[0]], target)[0] for target in ("zh", "en")]
    assert ids[0][1:] == ids[1][1:] and ids[0][0] != ids[1][0]
    refused = cli("translate", "--run", both_ways_run, english[0])
    assert refused.exit_code != 0 and "this model translates into zh, en: say which" in refused.output
    assert "--target" in refused.output
    wrong = cli("translate", "--run", both_ways_run, "--target", "de", english[0])
    assert wrong.exit_code != 0 and "does not translate into 'de'" in wrong.output


def test_a_glossary_keeps_each_outputs_own_word_rule(both_ways_run, monkeypatch):
    """In a batch into English and Chinese, a term written into English must end its word and one
    into Chinese need not (no spaces to end it): each row is searched with its own language's rule."""
    import attn_cli.engines.pytorch as torch_engine
    from attn_cli.decoding.glossary import Term, word_continuations
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    engine = load_engine([both_ways_run], [], None, "cpu")
    searched = []
    real = torch_engine.constrained_beam_search

    def spy(model, src, terms, settings, prefix=None, word_continuations=()):
        searched.extend(word_continuations)
        return real(model, src, terms, settings, prefix, word_continuations)

    monkeypatch.setattr(torch_engine, "constrained_beam_search", spy)
    sources = [Source("我喜欢猫。", terms=(Term("猫", ("cat",)),), target="en")]
    sources.append(Source("I like cats.", terms=(Term("cats", ("猫",)),), target="zh"))
    translate(engine, sources, engine.config.decode)
    english_rule = word_continuations(engine.tokenizers.target, "en")
    assert english_rule and len(searched) == 2
    assert searched == [english_rule, frozenset()]


def test_eval_scores_each_direction_with_its_own_tokenizer(both_ways_run):
    result = cli("eval", "--run", both_ways_run, "--beam", "1")
    assert result.exit_code == 0, result.output
    assert "en-zh:" in result.stdout and "zh-en:" in result.stdout
    assert "tok:zh" in result.stdout and "tok:13a" in result.stdout
    scores = [float(line.split()[2]) for line in result.stdout.splitlines() if line.startswith("BLEU = ")]
    mean = float(result.stdout.split("mean BLEU of the 2 directions: ")[1].split()[0])
    assert mean == pytest.approx(sum(scores) / 2, abs=0.01)
    one = cli("eval", "--run", both_ways_run, "--beam", "1", "--target", "en")
    assert one.exit_code == 0 and "tok:13a" in one.stdout and "tok:zh" not in one.stdout


def test_each_direction_is_served_and_routed_to_its_tag(both_ways_run):
    from fastapi.testclient import TestClient

    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine
    from attn_cli.serving.app import create_app
    from attn_cli.serving.models import ServedModels
    from attn_cli.serving.server import Server

    engine = load_engine([both_ways_run], [], None, "cpu")
    server = Server(ServedModels([engine]))
    assert len(server.batchers) == 1, "one worker for the one model"
    chinese = (both_ways_run / "data" / "test.zh-en.zh").read_text().splitlines()[:4]
    english = (both_ways_run / "data" / "test.en-zh.en").read_text().splitlines()[:4]
    with TestClient(create_app(server)) as client:
        assert [(lang["code"], lang["targets"]) for lang in client.get("/languages").json()] == [
            ("en", ["zh"]),
            ("zh", ["en"]),
        ]
        assert [m["name"] for m in client.get("/v1/models").json()["models"]] == ["en-zh", "zh-en"]
        for texts, source, target in ((chinese, "zh", "en"), (english, "en", "zh"), (chinese, "auto", "en")):
            expected = [
                t.text for t in translate(engine, [Source(s, target=target) for s in texts], engine.config.decode)
            ]
            answer = client.post("/translate", json={"q": texts, "source": source, "target": target})
            assert answer.json()["translatedText"] == expected, (source, target)
        named = client.post("/v1/translate", json={"q": chinese[0], "model": "zh-en"}).json()
        assert named["model"] == "zh-en" and named["translations"][0]["sentences"][0]["target"] == "en"
        assert client.post("/translate", json={"q": "x", "source": "en", "target": "de"}).status_code == 400


def test_the_exports_keep_the_tags(both_ways_run, tmp_path):
    import torch

    from attn_cli.checkpoint import load_checkpoint
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    checkpoint = load_checkpoint(both_ways_run / "checkpoints" / "best.pt")
    chinese = (both_ways_run / "data" / "test.zh-en.zh").read_text().splitlines()[:6]
    english = (both_ways_run / "data" / "test.en-zh.en").read_text().splitlines()[:6]
    refused = cli("export", "--run", both_ways_run, "--format", "argos", "--output", tmp_path / "x.argosmodel")
    assert refused.exit_code != 0 and "translates one direction" in refused.output and "en-zh, zh-en" in refused.output

    # Hugging Face: MarianTokenizer reads the typed tag as the token attn puts there
    transformers = pytest.importorskip("transformers")
    from attn_cli.huggingface.marian import marian_rows

    result = cli("export", "--run", both_ways_run, "--format", "hf", "--output", tmp_path / "hf")
    assert result.exit_code == 0, result.output
    tokenizer = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    to_marian = {attn: marian for marian, attn in enumerate(marian_rows(checkpoint.tokenizers.target.vocab_size))}
    for target, texts in (("en", chinese), ("zh", english)):
        ours = checkpoint.tokenizers.encode_sources(texts, target)
        theirs = tokenizer([f">>{target}<< {text}" for text in texts]).input_ids
        assert [[to_marian[i] for i in row] + [0] for row in ours] == theirs
    assert ">>en<<" in (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")

    # CTranslate2: the export's tokenizer asks as the checkpoint does, and greedy search agrees
    pytest.importorskip("ctranslate2")
    result = cli("export", "--run", both_ways_run, "--output", tmp_path / "ct2", "--quantization", "float32")
    assert result.exit_code == 0, result.output
    exported = load_engine([], [], tmp_path / "ct2", "cpu")
    engine = load_engine([both_ways_run], [], None, "cpu")
    from attn_cli.config import DecodeConfig

    greedy = DecodeConfig(beam_size=1, no_loops=False)
    for target, texts in (("en", chinese), ("zh", english)):
        sources = [Source(text, target=target) for text in texts]
        with torch.inference_mode():
            ours = [t.candidates[0].tokens for t in translate(engine, sources, greedy)]
        assert [t.candidates[0].tokens for t in translate(exported, sources, greedy)] == ours
