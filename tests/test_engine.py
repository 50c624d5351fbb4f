"""What an engine refuses follows what it declares it can do, one rule for the CLI and the server,
each in its own words."""

from dataclasses import replace

import pytest

from attn_cli.cli.decoding_flags import WORDING as CLI
from attn_cli.config import DecodeConfig
from attn_cli.decoding.engine import Capabilities, refusals
from attn_cli.decoding.glossary import Term
from attn_cli.decoding.records import Source
from attn_cli.serving.server import WORDING as SERVER

ABLE = Capabilities("the checkpoint", "pytorch", True, True, True, True, True)
ASKING = {
    "prefix": (Source("Hi", prefix="我"), DecodeConfig()),
    "terms": (Source("Hi", terms=(Term("Hi", ("你好",)),)), DecodeConfig(beam_size=5)),
    "attention": (Source("Hi", attention=True), DecodeConfig()),
    "sampling": (Source("Hi"), DecodeConfig(sample=True)),
    "output_rules": (Source("Hi"), DecodeConfig(no_stutter=True)),
}


@pytest.mark.parametrize("capability", ASKING)
def test_an_engine_refuses_exactly_what_it_cannot_do(capability):
    source, options = ASKING[capability]
    assert refusals(ABLE, options, [source]) == []
    unable = replace(ABLE, name="CTranslate2", **{capability: False})
    (refusal,) = refusals(unable, options, [source])
    assert refusal.warning == (capability == "output_rules")  # the output rules' absence is told, not refused
    for wording in (CLI, SERVER):  # every refusal can be worded by both callers
        assert refusal.message(wording).startswith(wording.names[refusal.option] + ": CTranslate2")


def test_terms_need_a_beam_in_any_engine():
    source, _ = ASKING["terms"]
    for options in (DecodeConfig(beam_size=1), DecodeConfig(sample=True)):
        (refusal,) = refusals(ABLE, options, [source])
        assert refusal.option == "terms" and "--beam 2" in refusal.message(CLI)
