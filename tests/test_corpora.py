"""Several corpora: each drawn per epoch at its weight (exactly, from the seed and the epoch), its
sources after its tag, validation and test carved off the corpora that say so, and the filters'
removals counted against the corpus each pair came from."""

import json
import shutil

import numpy as np
import pytest
import yaml
from support.runs import one_way, tiny_config, train_tiny

from attn_cli.config import ConfigError, CorpusConfig, DataConfig, FiltersConfig, TrainingCorpus, config_from_dict
from attn_cli.data.corpus import iter_corpus
from attn_cli.data.prepare import train_or_load_tokenizers
from attn_cli.data.split import split_corpus
from attn_cli.data.weighting import copies, draw_epoch, weighted_positions, weighted_stream


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Two TSV files from the built-in corpus: a general one of 1,500 pairs and a domain one of 400."""
    directory = tmp_path_factory.mktemp("corpora")
    pairs = list(dict.fromkeys(iter_corpus(CorpusConfig(path="builtin:tatoeba-cmn-eng"))))  # each pair once
    rng = np.random.default_rng(0)
    chosen = [pairs[i] for i in rng.permutation(len(pairs))[:1900]]
    for name, part in (("general", chosen[:1500]), ("domain", chosen[1500:])):
        (directory / f"{name}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in part), encoding="utf-8")
    return directory


def corpora_settings(directory, general: dict, domain: dict) -> list[str]:
    listed = [{"path": str(directory / "general.tsv"), **general}, {"path": str(directory / "domain.tsv"), **domain}]
    return [
        "data.corpus=null",
        f"data.corpora={yaml.safe_dump(listed, default_flow_style=True).strip()}",
        "data.src_lang=en",
        "data.tgt_lang=zh",
        "data.max_pairs=null",
    ]


def test_a_weight_draws_whole_copies_and_an_exact_fraction_anew_each_epoch():
    assert (copies(1000, 3.0, seed=1, epoch=1, corpus=0) == 3).all()
    half = copies(1000, 0.5, seed=1, epoch=1, corpus=0)
    assert half.sum() == 500 and set(half.tolist()) == {0, 1}
    again, next_epoch = copies(1000, 0.5, 1, 1, 0), copies(1000, 0.5, 1, 2, 0)
    assert (again == half).all() and not (next_epoch == half).all()  # the same epoch alike, the next anew
    other_corpus = copies(1000, 0.5, 1, 1, 1)
    assert not (other_corpus == half).all()
    one_and_a_half = copies(1000, 1.5, 1, 1, 0)
    assert one_and_a_half.sum() == 1500 and set(one_and_a_half.tolist()) == {1, 2}
    assert copies(7, 0.0, 1, 1, 0).sum() == 0

    positions = weighted_positions([4, 6], [2.0, 0.5], seed=3, epoch=1)
    assert positions[:8].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # the first corpus twice, in stored order
    assert len(positions) == 8 + 3 and all(4 <= p < 10 for p in positions[8:])


def test_the_tokenizer_sample_follows_the_draw_training_uses():
    items = [(0, f"a{i}") for i in range(10)] + [(1, f"b{i}") for i in range(20)]
    drawn = list(weighted_stream(iter(items), [10, 20], [2.0, 0.25], seed=5))
    assert drawn.count("a3") == 2 and sum(item.startswith("b") for item in drawn) == 5
    expected = copies(20, 0.25, 5, 1, 1)
    assert [drawn.count(f"b{i}") for i in range(20)] == expected.tolist()


def test_several_corpora_split_only_where_they_say_and_count_removals_per_corpus(corpora):
    general = TrainingCorpus(path=str(corpora / "general.tsv"), split=False)
    domain = TrainingCorpus(path=str(corpora / "domain.tsv"), weight=2.0)
    # The domain corpus repeats 30 general pairs: as duplicates, they are dropped from the domain.
    repeated = corpora / "domain-with-repeats.tsv"
    general_lines = (corpora / "general.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    repeated.write_text((corpora / "domain.tsv").read_text(encoding="utf-8") + "".join(general_lines[:30]))
    domain = TrainingCorpus(path=str(repeated), weight=2.0, name="domain")
    data = DataConfig(corpora=(general, domain), valid_size=40, test_size=40, filters=FiltersConfig(duplicates="pair"))
    split = split_corpus(data)
    domain_pairs = set(iter_corpus(domain))
    general_pairs = set(iter_corpus(general)) - domain_pairs
    assert split.valid and split.test
    assert all(
        pair in domain_pairs and pair not in general_pairs for pair in one_way(split.valid) + one_way(split.test)
    )
    assert [found.read for found in split.reads] == [1500, 430]
    assert [found.removals.counts for found in split.reads] == [{}, {"duplicates": 30}]
    counts = split.train_counts()
    assert counts[0] == 1500 and counts[1] == 400 - len(one_way(split.valid)) - len(one_way(split.test))
    by_corpus = list(split.train_pairs_by_corpus())
    assert [corpus for corpus, _ in by_corpus] == [0] * counts[0] + [1] * counts[1]


def test_a_tagged_corpus_trains_weighted_epochs_and_a_typed_tag_encodes_alike(corpora, tmp_path):
    run = tmp_path / "run"
    settings = corpora_settings(corpora, {"weight": 0.5, "split": False}, {"weight": 2.5, "tag": "<dom>"})
    result = train_tiny(run, *settings, "train.max_steps=4", "train.valid_bleu=false")
    assert result.exit_code == 0, result.output
    assert "validation and test pairs drawn from: domain.tsv" in result.output
    # Half of the 1,500 general pairs, and 2.5 times the 300 domain pairs that validation and test leave.
    drawn = "epoch 1: 1,500 pairs drawn at the corpora's weights (general.tsv 750, domain.tsv 750)"
    assert drawn in result.output, result.output

    from attn_cli.checkpoint import load_checkpoint
    from attn_cli.data.prepared import open_prepared

    loaded = load_checkpoint(run / "checkpoints" / "last.pt")
    tokenizers = loaded.tokenizers
    tag_id = tokenizers.source.piece_to_id("<dom>")
    assert tokenizers.tags == ("<dom>",)
    assert tokenizers.encode_sources(["<dom> I like tea."]) == [[tag_id, *tokenizers.source.encode(["I like tea."])[0]]]
    assert tokenizers.encode_sources(["<dom>x"])[0][0] != tag_id  # a tag is a word of its own
    # Translation reads a typed tag the same way: the part decoded holds the ids training saw.
    from support.decoding import engine_of, sources_of

    from attn_cli.config import DecodeConfig
    from attn_cli.decoding.parts import split_sources

    engine = engine_of(loaded.model, tokenizers)
    parts = split_sources(engine, sources_of(["<dom> I like tea.", "I like tea."]), DecodeConfig(split_clauses=False))
    assert [list(found.parts[0].ids) for found in parts] == tokenizers.encode_sources(
        ["<dom> I like tea.", "I like tea."]
    )

    entry = next(path for path in (run / "data" / "prepared").iterdir() if path.is_dir())
    prepared = open_prepared(entry.parent, entry.name)
    general_size, domain_size = prepared.corpus_sizes
    assert [
        prepared.train[i].src[0] == tag_id for i in (0, general_size - 1, general_size, len(prepared.train) - 1)
    ] == [
        False,
        False,
        True,
        True,
    ]
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["stats"]["valid_test_from"] == ["domain.tsv"]

    epoch = draw_epoch(prepared.train, prepared.corpus_sizes, [0.5, 2.5], seed=1, epoch=1)
    from_general = int((epoch.positions < general_size).sum())
    assert from_general == round(0.5 * general_size)
    assert len(epoch) - from_general == 2 * domain_size + round(0.5 * domain_size)


@pytest.mark.slow  # three training runs
def test_weighted_tagged_corpora_resume_bitwise(corpora, tmp_path):
    settings = [
        *corpora_settings(corpora, {"weight": 0.3}, {"weight": 1.7, "tag": "<dom>"}),
        "model.dropout=0.1",
        "train.valid_every=5",
        "train.valid_bleu=false",
        "train.join.rate=0.3",
        "train.max_tokens=4096",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train_tiny(straight, *settings, "train.max_steps=16").exit_code == 0
    assert train_tiny(resumed, *settings, "train.max_steps=7").exit_code == 0
    result = train_tiny(resumed, *settings, "train.max_steps=16", resume=True)
    assert result.exit_code == 0, result.output

    import torch

    left = torch.load(straight / "checkpoints" / "last.pt", weights_only=False)
    right = torch.load(resumed / "checkpoints" / "last.pt", weights_only=False)
    assert left["epoch"] >= 2  # an epoch boundary was crossed: the next epoch drew anew
    assert (left["step"], left["epoch"]) == (right["step"], right["epoch"])
    for name, tensor in left["model"].items():
        assert torch.equal(tensor, right["model"][name]), name


def test_the_tokenizer_vocabulary_follows_the_weights(corpora, tmp_path):
    """A word found only in a corpus of weight 0 does not become a piece; at weight 1 it does."""
    marked = corpora / "marked.tsv"
    marked.write_text("".join(f"Zorblax {i} zorblaxes.\t佐布拉{i}。\n" for i in range(300)), encoding="utf-8")
    pieces = {}
    for weight in (0.0, 1.0):
        listed = [{"path": str(corpora / "general.tsv")}, {"path": str(marked), "weight": weight, "split": False}]
        cfg = tiny_config(
            "data.corpus=null",
            f"data.corpora={yaml.safe_dump(listed, default_flow_style=True).strip()}",
            "data.max_pairs=null",
            "data.src_lang=en",
            "data.tgt_lang=zh",
            run_dir=tmp_path / f"weight-{weight}",
        )
        split = split_corpus(cfg.data)
        tokenizers = train_or_load_tokenizers(cfg, split, log=lambda _: None)
        pieces[weight] = tokenizers.source.encode(["Zorblax"])[0]
    assert len(pieces[1.0]) < len(pieces[0.0])


@pytest.mark.parametrize(
    ("data", "key", "words"),
    [
        (
            {"corpus": {"path": "a.tsv"}, "corpora": [{"path": "b.tsv"}]},
            "data.corpus",
            "not both",
        ),
        ({"corpora": [{"path": "x/a.tsv"}, {"path": "y/a.tsv"}]}, "data.corpora[1].name", "a name of its own"),
        ({"corpora": [{"path": "a.tsv", "weight": 0}]}, "data.corpora", "weight 0"),
        ({"corpora": [{"path": "a.tsv", "weight": -1}]}, "data.corpora[0].weight", "between 0 and"),
        ({"corpora": [{"path": "a.tsv", "split": False}]}, "data.corpora", "split: true"),
        ({"corpora": [{"path": "a.tsv", "tag": "<b t>"}]}, "data.corpora[0].tag", "one piece"),
        ({"corpora": [{"path": "a.tsv", "wieght": 2}]}, "data.corpora[0].wieght", "did you mean 'weight'"),
    ],
)
def test_bad_corpora_are_refused_with_their_key(data, key, words):
    with pytest.raises(ConfigError) as error:
        config_from_dict({"data": {"src_lang": "de", "tgt_lang": "en", **data}})
    assert error.value.key == key and words in str(error.value)


def test_a_retrained_tokenizer_is_needed_for_a_new_tag(corpora, tmp_path):
    run = tmp_path / "run"
    plain = corpora_settings(corpora, {}, {"split": False})
    assert train_tiny(run, *plain, "train.max_steps=1").exit_code == 0
    tagged = corpora_settings(corpora, {}, {"split": False, "tag": "<dom>"})
    shutil.rmtree(run / "checkpoints")  # a new run in the same directory: the saved tokenizer is reused
    result = train_tiny(run, *tagged, "train.max_steps=2")
    assert result.exit_code != 0
    assert "no piece for the corpus tag '<dom>'" in result.output and "--retrain" in result.output
