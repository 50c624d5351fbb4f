import dataclasses

import pytest

from attn_cli.config import TokenizerConfig
from attn_cli.data.tokenizer import Tokenizer, TokenizerError, Tokenizers, train_tokenizers
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

ENGLISH = [f"I have {n} apples and {n + 1} pears." for n in range(300)]
CHINESE = [f"我有{n}个苹果和{n + 1}个梨。" for n in range(300)]
CONFIG = TokenizerConfig(vocab_size=300, character_coverage=1.0)


def test_joint_vocabulary_round_trips_and_byte_fallback_encodes_anything(tmp_path):
    tokenizers = train_tokenizers(ENGLISH, CHINESE, CONFIG)
    assert tokenizers.joint
    unseen = "Zebra 斑马 🦓"
    ids = tokenizers.source.encode([unseen])[0]
    assert UNK_ID not in ids
    assert tokenizers.source.decode([ids]) == [unseen]
    assert tokenizers.source.decode([[BOS_ID] + ids + [EOS_ID, PAD_ID]]) == [unseen]
    tokenizers.save(tmp_path)
    assert Tokenizers.load(tmp_path).source.encode([unseen]) == [ids]


def test_an_unknown_piece_stays_visible_in_the_decoded_text():
    """Without byte fallback a character outside the vocabulary is <unk>: decoding writes it as
    SentencePiece's ⁇ instead of dropping the word, and a decode-encode round trip (as joined
    training pairs take) keeps it unknown."""
    tokenizers = train_tokenizers(ENGLISH, CHINESE, dataclasses.replace(CONFIG, byte_fallback=False))
    ids = tokenizers.source.encode(["I have 斑马 apples."])[0]
    assert UNK_ID in ids
    (text,) = tokenizers.source.decode([[BOS_ID] + ids + [EOS_ID]])
    assert "⁇" in text and text.startswith("I have") and text.endswith("apples.")
    assert UNK_ID in tokenizers.source.encode([text])[0]


def test_separate_vocabularies_and_bpe(tmp_path):
    tokenizers = train_tokenizers(ENGLISH, CHINESE, dataclasses.replace(CONFIG, joint=False, model_type="bpe"))
    assert not tokenizers.joint
    tokenizers.save(tmp_path)
    reloaded = Tokenizers.load(tmp_path)
    assert reloaded.target.encode(CHINESE[:3]) == tokenizers.target.encode(CHINESE[:3])
    assert tokenizers.source.encode_pieces(["apples"]) != tokenizers.target.encode_pieces(["apples"])


def test_too_small_vocabulary_says_which_key_to_change():
    with pytest.raises(TokenizerError, match="raise tokenizer.vocab_size or lower tokenizer.character_coverage"):
        train_tokenizers(
            ENGLISH,
            [
                c * 3
                for c in "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家"
                "学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长"
                * 3
            ],
            dataclasses.replace(CONFIG, vocab_size=300),
        )


def test_chinese_full_width_punctuation_survives_a_round_trip():
    # The references keep ，？！; a tokenizer that normalises them to ASCII loses BLEU on every sentence.
    tokenizers = train_tokenizers(ENGLISH, [c + "，真的吗？是的！" for c in CHINESE], CONFIG)
    text = "我有三个苹果，真的吗？是的！"
    assert tokenizers.target.decode(tokenizers.target.encode([text])) == [text]


def test_switching_to_separate_vocabularies_leaves_no_stale_joint_model(tmp_path):
    train_tokenizers(ENGLISH, CHINESE, CONFIG).save(tmp_path)
    separate = train_tokenizers(ENGLISH, CHINESE, dataclasses.replace(CONFIG, joint=False))
    separate.save(tmp_path)
    assert not Tokenizers.load(tmp_path).joint


def test_a_reused_tokenizer_must_match_the_config(tmp_path):
    from attn_cli.config import Config, ConfigError, CorpusConfig, DataConfig
    from attn_cli.data.prepare import train_or_load_tokenizers
    from attn_cli.data.split import split_corpus

    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"{en}\t{zh}\n" for en, zh in zip(ENGLISH, CHINESE)), encoding="utf-8")
    cfg = Config(
        run_dir=str(tmp_path),
        tokenizer=CONFIG,
        data=DataConfig(corpus=CorpusConfig(path=str(corpus)), valid_size=0, test_size=0),
    )
    splits = split_corpus(cfg.data)
    first = train_or_load_tokenizers(cfg, splits, log=lambda _: None)
    assert train_or_load_tokenizers(cfg, splits, log=lambda _: None).source.model_proto == first.source.model_proto
    bigger = dataclasses.replace(cfg, tokenizer=dataclasses.replace(CONFIG, vocab_size=400))
    with pytest.raises(ConfigError, match="attn tokenizer --retrain"):
        train_or_load_tokenizers(bigger, splits, log=lambda _: None)


def test_a_damaged_tokenizer_model_is_named_with_the_fix(tmp_path):
    (tmp_path / "joint.model").write_bytes(b"not a model")
    with pytest.raises(
        TokenizerError,
        match=r"joint.model is not a SentencePiece model \(damaged, or another kind of "
        r"file\); train it again with `attn tokenizer --retrain`$",
    ):
        Tokenizers.load(tmp_path)


@pytest.mark.parametrize("joint", [True, False])
def test_a_source_prefix_is_one_piece_before_every_source_and_travels_with_the_tokenizer(tmp_path, joint):
    """tokenizer.source_prefix: a multi-target model's language token, once at the start of each
    source (not of a target), kept by save/load and by a checkpoint's state."""
    cfg = dataclasses.replace(CONFIG, joint=joint, source_prefix=">>cmn_Hans<<")
    tokenizers = train_tokenizers(ENGLISH, CHINESE, cfg)
    prefix = tokenizers.source.piece_to_id(">>cmn_Hans<<")
    assert prefix > EOS_ID
    sources = tokenizers.encode_sources(ENGLISH[:3])
    assert sources == [[prefix, *ids] for ids in tokenizers.source.encode(ENGLISH[:3])]
    tokenizers.save(tmp_path)
    for copy in (Tokenizers.load(tmp_path), Tokenizers.from_state(tokenizers.to_state())):
        assert copy.source_prefix == ">>cmn_Hans<<" and copy.encode_sources(ENGLISH[:3]) == sources
        assert copy.joint == joint
    plain = train_tokenizers(ENGLISH, CHINESE, CONFIG)
    assert plain.encode_sources(ENGLISH[:3]) == plain.source.encode(ENGLISH[:3])
    old_state = {"source": plain.source.model_proto, "target": None}  # a checkpoint from before the key
    assert Tokenizers.from_state(old_state).source_prefix is None
    with pytest.raises(TokenizerError, match="tokenizer.source_prefix '>>fra<<' is not a piece"):
        Tokenizers(plain.source, plain.target, ">>fra<<")


def test_a_vocabulary_of_its_own_maps_pieces_to_its_ids(tmp_path):
    """Two SentencePiece models sharing one vocabulary whose ids are not theirs (an imported model):
    a piece's id is its place in the vocabulary, a piece it lacks is <unk>, decoding maps back."""
    source = train_tokenizers(ENGLISH, ENGLISH, CONFIG).source
    target = train_tokenizers(CHINESE, CHINESE, CONFIG).target
    pieces = sorted({p for t in (source, target) for p in t.id_to_piece(range(4, t.vocab_size))}, reverse=True)
    vocabulary = ["<pad>", "<unk>", "<s>", "</s>", *pieces[:-5]]  # the last five pieces left out
    missing = set(pieces[-5:])
    tokenizers = Tokenizers(
        Tokenizer(source.model_proto, vocabulary=vocabulary), Tokenizer(target.model_proto, vocabulary=vocabulary)
    )
    assert tokenizers.joint and tokenizers.source.vocab_size == len(vocabulary)
    text = ENGLISH[7]
    expected = [UNK_ID if p in missing else vocabulary.index(p) for p in source.encode_pieces([text])[0]]
    assert tokenizers.source.encode([text]) == [expected] != source.encode([text])
    known = [t for t in CHINESE[:50] if UNK_ID not in tokenizers.target.encode([t])[0]]
    assert len(known) >= 5
    assert tokenizers.target.decode(tokenizers.target.encode(known)) == known
    tokenizers.save(tmp_path)
    reloaded = Tokenizers.load(tmp_path)
    assert reloaded.source.encode([text]) == [expected] and reloaded.target.vocabulary == vocabulary
    with pytest.raises(TokenizerError, match="must begin with <pad>, <unk>, <s>, </s>"):
        Tokenizer(source.model_proto, vocabulary=["<unk>", "<pad>", "<s>", "</s>", "a"])


def test_tokenizers_that_differ_only_in_their_prefix_are_not_the_same_to_an_ensemble_or_the_data_cache():
    from attn_cli.checkpoint import require_shared_tokenizers
    from attn_cli.config import DataConfig
    from attn_cli.data.prepared import entry_name
    from attn_cli.errors import UserError

    cfg = dataclasses.replace(CONFIG, source_prefix=">>cmn_Hans<<")
    one = train_tokenizers(ENGLISH, CHINESE, cfg)
    other = Tokenizers(one.source, one.target, None)
    assert one.encode_sources([""]) == [[]], "an empty line stays empty"
    with pytest.raises(UserError, match="use different tokenizers"):
        require_shared_tokenizers([("a.pt", one), ("b.pt", other)])
    require_shared_tokenizers([("a.pt", one), ("c.pt", Tokenizers.from_state(one.to_state()))])
    assert entry_name(DataConfig(), one) != entry_name(DataConfig(), other)
