"""attn eval --by-length: scores per source-length bucket, stutter and broken characters."""

import shutil

import pytest
from typer.testing import CliRunner

from attn_cli.cli.app import app
from attn_cli.decoding.by_length import scores_by_length
from attn_cli.decoding.scoring import score_translations
from attn_cli.decoding.stutter import stutters


@pytest.mark.parametrize(
    "text, expected",
    [
        ("你在我叔叔叔叔叔叔叔叔了。", True),
        ("我祖母在一座一座一座一座一座小的村庄里长大。", True),
        ("哈哈哈", True),
        ("哈哈", False),
        ("你好，世界。", False),
        ("他们他们", False),
        ("abcdeabcdeabcde", False),
        # Numbers and runs of spaces are not stutter; a stutter after one still counts.
        ("他给了我10000日元。", False),
        ("一共1111个。", False),
        ("a   b", False),
        ("10000个人人人", True),
    ],
)
def test_a_unit_of_one_to_four_characters_three_times_in_a_row_is_a_stutter(text, expected):
    assert stutters(text) is expected


def test_each_sentence_is_scored_in_the_bucket_of_its_source_length():
    sources = ["one two three", "a " * 10, "word " * 20, "short one", "b " * 12]
    hypotheses = ["我们走吧。", "他叔叔叔叔来了。", "今天天气很好\ufffd。", "好的。", "我不知道。"]
    references = ["我们走吧。", "他叔叔来了。", "今天天气很好。", "好。", "我不知道。"]
    rows = {row.name: row for row in scores_by_length(sources, hypotheses, references, "zh")}
    assert [(name, row.pairs) for name, row in rows.items()] == [("<= 8", 2), ("9-15", 2), ("> 15", 1), ("all", 5)]
    assert rows["9-15"].stutter_rate == 0.5 and rows["9-15"].reference_stutter_rate == 0.0
    assert rows["> 15"].replacement_characters == 1 and rows["all"].replacement_characters == 1
    assert rows["<= 8"].length_ratio == pytest.approx(8 / 7)  # 我们走吧。 + 好的。 against 我们走吧。 + 好。
    alone = score_translations(hypotheses, references, "zh")
    assert (rows["all"].bleu, rows["all"].chrf) == (alone[0].score, alone[1].score)
    short = score_translations([hypotheses[0], hypotheses[3]], [references[0], references[3]], "zh")
    assert rows["<= 8"].bleu == short[0].score


def test_attn_eval_prints_the_table_by_length(trained_run, tmp_path):
    src, ref = tmp_path / "src.en", tmp_path / "ref.zh"
    src.write_text(
        "I am here.\nThe man you see over there is my uncle and he lives in a big house.\n", encoding="utf-8"
    )
    ref.write_text("我在这里。\n你在那儿看到的那个人是我叔叔，他住在一座大房子里。\n", encoding="utf-8")
    run = shutil.copytree(trained_run, tmp_path / "run")  # eval writes its hypotheses beside the checkpoint
    result = CliRunner().invoke(
        app, ["eval", "--run", str(run), "--src", str(src), "--ref", str(ref), "--by-length", "--beam", "1"]
    )
    assert result.exit_code == 0, result.output
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in table[1:]] == ["<= 8", "> 15", "all"], table
