"""Input lines and output files: line N of the output always answers line N of the input."""

from attn_cli.decoding.io import read_lines


def test_input_lines_end_at_newlines_only(tmp_path):
    path = tmp_path / "in.en"
    path.write_bytes("a\x0cb\nc\u2028d\r\n\ne\x85f\rg\n".encode("utf-8"))
    # A form feed, U+2028, NEL and a lone \r stay inside their lines; a \r before \n goes.
    assert read_lines(path) == ["a\x0cb", "c\u2028d", "", "e\x85f\rg"]
    path.write_bytes(b"no final newline")
    assert read_lines(path) == ["no final newline"]
    path.write_bytes(b"")
    assert read_lines(path) == []
