"""One rule per language fact: a code is read by its primary subtag, so zh-CN is Chinese everywhere."""

import pytest

from attn_cli import languages
from attn_cli.decoding.scoring import score_translations


def test_codes_are_read_by_their_primary_subtag():
    assert [languages.primary_subtag(c) for c in ("zh", "ZH", "zh-CN", "zh_Hans", " en-US")] == ["zh"] * 4 + ["en"]


@pytest.mark.parametrize("code", ["zh", "zh-CN", "zh_Hans", "ZH", "ja_JP", "th", "bo"])
def test_unspaced_languages_join_with_nothing(code):
    assert languages.is_unspaced(code) and languages.joiner(code) == ""


@pytest.mark.parametrize("code", ["en", "de-CH", "fr", "ko", "zhx"])
def test_spaced_languages_join_with_a_space(code):
    assert not languages.is_unspaced(code) and languages.joiner(code) == " "


@pytest.mark.parametrize("code", ["zh", "zh-CN", "zh_Hant", "ZH"])
def test_chinese_bleu_is_scored_by_character_whatever_the_code(code):
    bleu, _ = score_translations(["我爱你。"], ["我爱他。"], code)
    assert "tok:zh" in bleu.signature
    assert bleu.score == score_translations(["我爱你。"], ["我爱他。"], "zh")[0].score > 0


def test_other_languages_are_scored_with_13a():
    assert "tok:13a" in score_translations(["a b"], ["a b"], "en-GB")[0].signature
