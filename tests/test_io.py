"""Input lines and output files: line N of the output always answers line N of the input."""

import pytest

from attn_cli.decoding.io import Reading, read_lines
from attn_cli.decoding.records import Source
from attn_cli.errors import UserError


def test_input_lines_end_at_newlines_only(tmp_path):
    path = tmp_path / "in.en"
    path.write_bytes("a\x0cb\nc\u2028d\r\n\ne\x85f\rg\n".encode("utf-8"))
    # A form feed, U+2028, NEL and a lone \r stay inside their lines; a \r before \n goes.
    assert read_lines(path) == ["a\x0cb", "c\u2028d", "", "e\x85f\rg"]
    path.write_bytes(b"no final newline")
    assert read_lines(path) == ["no final newline"]
    path.write_bytes(b"")
    assert read_lines(path) == []


def test_text_input_lines_are_sources_that_share_the_prefix_flag():
    sources = Reading("text", prefix="我").sources(["Hello.", "", "Go."], "in.en")
    assert [(s.text, s.prefix) for s in sources] == [("Hello.", "我"), ("", "我"), ("Go.", "我")]
    assert Reading("text").sources(['{"source": "x"}'], "in.en") == [Source('{"source": "x"}', "", ())]
    # the attention the command asks for goes with every source
    assert [s.attention for s in Reading("text", attention=True).sources(["a", "b"], "in.en")] == [True, True]


def test_jsonl_lines_add_their_own_glossary_to_the_flags():
    from attn_cli.decoding.glossary import Term

    general = [Term("Tom", ("汤姆",)), Term("cat", ("猫",))]
    lines = ['{"source": "Tom.", "glossary": [["tom", "汤米", "汤姆"], ["dog", "狗"]]}', '{"source": "Go."}']
    sources = Reading("jsonl", glossary=tuple(general)).sources(lines, "in.jsonl")
    assert [list(s.terms) for s in sources] == [
        [Term("cat", ("猫",)), Term("tom", ("汤米", "汤姆")), Term("dog", ("狗",))],
        general,
    ]
    with pytest.raises(UserError, match=r"in.jsonl line 1: 'glossary'\[1\]: \['dog'\] is not a list of two or more"):
        Reading("jsonl").sources(['{"source": "x", "glossary": [["a", "b"], ["dog"]]}'], "in.jsonl")


def test_jsonl_input_lines_give_a_source_and_their_own_prefix():
    lines = ['{"source": "Hello.", "prefix": "你"}', '{"source": "Go."}', "", '{"prefix": "", "source": "Tom."}']
    sources = Reading("jsonl").sources(lines, "in.jsonl")
    assert [(s.text, s.prefix) for s in sources] == [("Hello.", "你"), ("Go.", ""), ("", ""), ("Tom.", "")]
    # --prefix applies to the lines that give none
    assert [s.prefix for s in Reading("jsonl", prefix="我").sources(lines, "in.jsonl")] == ["你", "我", "我", ""]


def test_a_jsonl_line_asks_for_its_own_target_language_or_the_readings():
    lines = ['{"source": "我喜欢茶。", "target": "en"}', '{"source": "Tea."}']
    assert [s.target for s in Reading("jsonl").sources(lines, "in.jsonl")] == ["en", None]
    assert [s.target for s in Reading("jsonl", target="zh").sources(lines, "in.jsonl")] == ["en", "zh"]
    assert [s.target for s in Reading("text", target="zh").sources(["Tea."], "in.txt")] == ["zh"]


@pytest.mark.parametrize(
    "line,problem",
    [
        ("Hello.", "not JSON (Expecting value at column 1)"),
        ('["Hello."]', "a JSON array, not an object"),
        ('{"prefix": "你"}', "no 'source'"),
        ('{"source": "Hello.", "prefx": "你"}', "unknown key 'prefx'"),
        ('{"source": 3}', "'source' is a JSON number, not a string"),
        ('{"source": "Hello.", "prefix": null}', "'prefix' is a JSON null, not a string"),
        ('{"source": "Hello.", "target": ["zh"]}', "'target' is a JSON array, not a string"),
    ],
)
def test_a_bad_jsonl_input_line_is_one_line_naming_it_and_the_fix(line, problem):
    with pytest.raises(UserError) as error:
        Reading("jsonl").sources(['{"source": "fine"}', line], "in.jsonl", first_number=7)
    assert str(error.value) == (
        f'in.jsonl line 8: {problem}; write each line as {{"source": "...", "prefix": "...", "glossary": '
        f'[["term", "target"]], "target": "zh"}} (all but "source" optional)'
    )
