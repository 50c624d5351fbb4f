"""Training pairs joined into longer ones: each epoch holds every pair once, a joined pair is what
its joined text tokenizes to, and the draw depends on (seed, epoch) alone."""

import numpy as np
import pytest

from attn_cli.data.joining import JoinSettings, join_epoch, plan_groups
from attn_cli.data.prepared import TokenizedPairs
from attn_cli.data.tokenizer import Tokenizers

SETTINGS = JoinSettings(
    rate=0.3, max_pairs=3, max_source_tokens=40, max_target_tokens=40, source_separator=" ", target_separator=""
)


@pytest.fixture(scope="module")
def base_and_tokenizers(trained_run):
    entries = [entry for entry in (trained_run / "data" / "prepared").iterdir() if entry.is_dir()]
    return TokenizedPairs.open(entries[0]), Tokenizers.load(trained_run / "tokenizer")


def test_groups_are_disjoint_sized_and_within_the_limits():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 20, 1000), rng.integers(1, 20, 1000)
    groups = plan_groups(src, tgt, SETTINGS, np.random.default_rng(1))
    members = np.concatenate(groups)
    assert len(set(members.tolist())) == len(members)  # no pair in two groups
    assert all(2 <= len(group) <= SETTINGS.max_pairs for group in groups)
    assert all(src[g].sum() <= 40 and tgt[g].sum() <= 40 for g in groups)
    assert 0.25 * 1000 <= len(members) <= 0.3 * 1000  # the rate's share, less a few left alone
    assert {len(group) for group in groups} == {2, 3}
    assert plan_groups(src, tgt, JoinSettings(0.0, 3, 40, 40, " ", ""), np.random.default_rng(1)) == []


def test_an_epoch_holds_every_pair_once_and_joined_pairs_tokenize_their_joined_text(base_and_tokenizers):
    base, tokenizers = base_and_tokenizers
    epoch = join_epoch(base, tokenizers, SETTINGS, seed=1, epoch=1)
    assert epoch.joined_count > 0.1 * len(base) / SETTINGS.max_pairs
    singles = epoch.singles.tolist()
    assert len(set(singles)) == len(singles)

    # Every base pair's target appears once: alone, or inside exactly one joined target.
    joined_targets = tokenizers.target.decode([epoch[i].tgt for i in range(len(singles), len(epoch))])
    alone = set(singles)
    unjoined = [tokenizers.target.decode([base[p].tgt])[0] for p in range(len(base)) if p not in alone]
    assert len(unjoined) + len(singles) == len(base)
    text = "\n".join(joined_targets)
    assert all(target in text for target in unjoined)
    assert sum(len(t) for t in unjoined) == sum(len(t) for t in joined_targets)  # "" separator: nothing added

    for i in range(len(singles), len(epoch)):
        example = epoch[i]
        source_text = tokenizers.source.decode([example.src])[0]
        target_text = tokenizers.target.decode([example.tgt])[0]
        assert example.src == tokenizers.source.encode([source_text])[0]
        assert example.tgt == tokenizers.target.encode([target_text])[0]
        assert len(example.src) <= 40 and len(example.tgt) <= 40
    for i in range(len(singles)):
        assert epoch[i].src == base[singles[i]].src and epoch[i].tgt == base[singles[i]].tgt

    lengths = epoch.src_lengths + epoch.tgt_lengths
    assert [len(epoch[i].src) + len(epoch[i].tgt) for i in range(len(epoch))] == lengths.tolist()
    some = np.array([0, len(singles), len(epoch) - 1])
    assert epoch.token_count(some) == int(lengths[some].sum())


def test_the_draw_depends_on_seed_and_epoch_alone(base_and_tokenizers):
    base, tokenizers = base_and_tokenizers

    def draw(seed, epoch):
        made = join_epoch(base, tokenizers, SETTINGS, seed=seed, epoch=epoch)
        return made.singles.tolist(), made.joined.src_ids.tolist()

    assert draw(1, 2) == draw(1, 2)
    assert draw(1, 2) != draw(1, 3) and draw(1, 2) != draw(2, 2)


def test_joining_a_chunk_at_a_time_gives_the_same_epoch(base_and_tokenizers, monkeypatch):
    from attn_cli.data import joining

    base, tokenizers = base_and_tokenizers
    whole = join_epoch(base, tokenizers, SETTINGS, seed=1, epoch=4)
    monkeypatch.setattr(joining, "_CHUNK", 7)
    chunked = join_epoch(base, tokenizers, SETTINGS, seed=1, epoch=4)
    assert whole.joined_count > 7
    assert chunked.singles.tolist() == whole.singles.tolist()
    assert [chunked[i] for i in range(len(chunked))] == [whole[i] for i in range(len(whole))]


def test_no_pair_joined_when_none_fits(base_and_tokenizers):
    base, tokenizers = base_and_tokenizers
    tight = JoinSettings(
        rate=0.5, max_pairs=3, max_source_tokens=1, max_target_tokens=1, source_separator=" ", target_separator=""
    )
    epoch = join_epoch(base, tokenizers, tight, seed=1, epoch=1)
    assert epoch.joined_count == 0 and epoch.singles.tolist() == list(range(len(base)))
    assert epoch.src_lengths.tolist() == base.src_lengths.tolist()
