"""Training pairs recased: an epoch holds every pair once, a recased pair is what its recased text
tokenizes to, caseless text stays as it was, a tag stays a tag, and the draw depends on
(seed, epoch) alone."""

import numpy as np
import pytest

from attn_cli.config import TokenizerConfig
from attn_cli.data.casing import CasingSettings, case_epoch, title_case
from attn_cli.data.joining import JoinSettings, join_epoch
from attn_cli.data.prepared import TokenizedPairs
from attn_cli.data.tokenizer import Tokenizers, train_tokenizers

SETTINGS = CasingSettings(upper=0.2, title=0.1, max_source_tokens=128, max_target_tokens=128)


@pytest.fixture(scope="module")
def base_and_tokenizers(trained_run):
    entries = [entry for entry in (trained_run / "data" / "prepared").iterdir() if entry.is_dir()]
    return TokenizedPairs.open(entries[0]), Tokenizers.load(trained_run / "tokenizer")


def test_title_case_capitalises_each_word_and_leaves_the_rest():
    assert title_case("don't stop me now, o'neill") == "Don't Stop Me Now, O'neill"
    assert title_case("我喜欢茶。") == "我喜欢茶。"


def test_an_epoch_recases_its_shares_and_each_recased_pair_tokenizes_its_recased_text(base_and_tokenizers):
    base, tokenizers = base_and_tokenizers
    epoch = case_epoch(base, tokenizers, SETTINGS, seed=1, epoch=1)
    assert len(epoch) == len(base)
    assert 0.28 * len(base) <= epoch.recased_count <= 0.3 * len(base) + 1  # less those over the limits
    changed = set(epoch.positions.tolist())
    uppers = titles = 0
    for i in range(len(base)):
        original, now = base[i], epoch[i]
        if i not in changed:
            assert (now.src, now.tgt) == (original.src, original.tgt)
            continue
        source = tokenizers.source.decode([original.src])[0]
        recased = tokenizers.source.decode([now.src])[0]
        assert recased in (source.upper(), title_case(source))
        uppers += recased == source.upper() != title_case(source)
        titles += recased == title_case(source) != source.upper()
        assert now.src == tokenizers.encode_sources([recased])[0]
        # Chinese has no case: the target is the same text, tokenized the same.
        assert now.tgt == original.tgt
    assert uppers > titles > 0
    assert list(epoch.src_lengths) == [len(epoch[i].src) for i in range(len(epoch))]
    assert epoch.token_count(np.arange(len(epoch))) == sum(
        len(epoch[i].src) + len(epoch[i].tgt) for i in range(len(epoch))
    )

    again = case_epoch(base, tokenizers, SETTINGS, seed=1, epoch=1)
    assert (again.positions == epoch.positions).all()
    assert not np.array_equal(case_epoch(base, tokenizers, SETTINGS, seed=1, epoch=2).positions, epoch.positions)


def test_a_tag_and_the_source_prefix_survive_recasing_and_joining():
    config = TokenizerConfig(vocab_size=300, character_coverage=1.0, source_prefix=">>zh<<")
    sources = [f"the sentence number {i} is here" for i in range(200)]
    tokenizers = train_tokenizers(sources, [f"句子{i}号" for i in range(200)], config, tags=["<bt>"])
    texts = ["<bt> the sentence number 7", "the sentence number 8"]
    src = tokenizers.encode_sources(texts)
    tag_id, prefix_id = tokenizers.source.piece_to_id("<bt>"), tokenizers.source.piece_to_id(">>zh<<")
    assert src[0][:2] == [prefix_id, tag_id] and src[1][0] == prefix_id and tag_id not in src[1]
    assert tokenizers.decode_sources(src) == texts
    base = TokenizedPairs.from_rows(
        [np.asarray(row, dtype=np.int32) for row in src],
        [np.asarray(row, dtype=np.int32) for row in tokenizers.target.encode(["句子7号", "句子8号"])],
    )
    upper = case_epoch(base, tokenizers, CasingSettings(1.0, 0.0, 64, 64), seed=0, epoch=1)
    assert tokenizers.decode_sources([upper[0].src, upper[1].src]) == [
        "<bt> THE SENTENCE NUMBER 7",
        "THE SENTENCE NUMBER 8",
    ]
    joined = join_epoch(base, tokenizers, JoinSettings(1.0, 2, 64, 64, " ", ""), seed=0, epoch=1)
    assert joined.joined_count == 1
    row = joined[len(joined) - 1].src
    assert row.count(prefix_id) == 1 and row.count(tag_id) <= 1  # once each, wherever the tagged pair fell
