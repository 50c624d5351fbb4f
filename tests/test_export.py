"""attn export: a CTranslate2 model directory that decodes like attn's own search."""

import dataclasses
import shutil
import sys

import pytest
import torch
from support.decoding import engine_of, sources_of
from support.runs import train_tiny
from typer.testing import CliRunner

from attn_cli.cli.app import app
from attn_cli.config import Config, CorpusConfig, DataConfig, DecodeConfig, ModelConfig, TokenizerConfig
from attn_cli.data.tokenizer import train_tokenizers
from attn_cli.decoding.pipeline import translate
from attn_cli.engines import pytorch
from attn_cli.engines.ctranslate2 import load_exported
from attn_cli.engines.pytorch import TorchEngine
from attn_cli.export.convert import export
from attn_cli.model import build_model

pytest.importorskip("ctranslate2")

SOURCES = [f"sentence number {i}" for i in range(200)]
TARGETS = [f"句子{i}号，{chr(0x4E00 + i % 20)}。" for i in range(200)]


TESTED = SOURCES[::5] + ["Tom is late, but where is the station?", "Hi.", "a b c d e f g h i j k l m n o p"]


def _random_model(model_cfg: ModelConfig, joint: bool):
    """A config, tokenizers and random weights scaled up so that each input gets its own output."""
    cfg = Config(
        data=DataConfig(corpus=CorpusConfig(path="corpus.tsv")),
        model=model_cfg,
        tokenizer=TokenizerConfig(vocab_size=320 if joint else 300, character_coverage=1.0, joint=joint),
    )
    tokenizers = train_tokenizers(SOURCES, TARGETS, cfg.tokenizer)
    torch.manual_seed(0)
    model = build_model(model_cfg, tokenizers.source.vocab_size, tokenizers.target.vocab_size).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.mul_(3.0)
        if model.output_bias is not None:  # a bias that changes what is chosen
            model.output_bias.normal_(0.0, 2.0)
    return cfg, tokenizers, model


VARIANTS = {
    "pre-LN, sinusoidal, joint": (dict(norm="pre", positions="sinusoidal"), True),
    "post-LN, learned, separate": (dict(norm="post", positions="learned", share_embeddings=False), False),
    "pre-LN, learned, joint": (dict(norm="pre", positions="learned"), True),
    "post-LN, sinusoidal, separate": (dict(norm="post", positions="sinusoidal", share_embeddings=False), False),
    "post-LN, Marian's sinusoids, joint, SiLU, logits bias": (
        dict(norm="post", positions="sinusoidal", sinusoid_layout="halves", activation="silu", output_bias=True),
        True,
    ),
    "pre-LN, learned, joint, GELU": (dict(norm="pre", positions="learned", activation="gelu"), True),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_float32_export_searches_like_attn(tmp_path, variant, monkeypatch):
    """Random weights, scaled up: each input gets its own output, most of them cut at the length limit."""
    settings, joint = VARIANTS[variant]
    model_cfg = ModelConfig(
        d_model=32,
        num_heads=4,
        ffn_dim=64,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_positions=160,
        **settings,
    )
    cfg, tokenizers, model = _random_model(model_cfg, joint)
    export(cfg, tokenizers, model, tmp_path / "exported", "float32")
    exported = load_exported(tmp_path / "exported", threads=1)
    # attn's search without its UTF-8 constraint, which CTranslate2 has no counterpart of: random
    # weights write byte pieces freely.
    monkeypatch.setattr(pytorch, "output_constraints", lambda target, options: ())
    engine = engine_of(model, tokenizers, 63)
    assert all(len(ids) < 63 for ids in tokenizers.source.encode(TESTED)), "no input is split: both take it whole"
    for options in (
        # no_loops off: a random model loops, which attn's search rules out as it goes and
        # CTranslate2 by decoding the sentence again (test_an_export_decodes_a_looping_sentence_again)
        DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=5, no_loops=False),
        DecodeConfig(beam_size=4, n_best=2, max_len_a=1.0, max_len_b=5, no_loops=False),
    ):
        ours = translate(engine, sources_of(TESTED), options)
        theirs = translate(exported, sources_of(TESTED), options)
        same = sum(o.candidates[0].tokens == t.candidates[0].tokens for o, t in zip(ours, theirs))
        assert same >= (len(TESTED) if options.beam_size == 1 else 0.95 * len(TESTED)), (
            f"beam {options.beam_size}: {len(TESTED) - same} of {len(TESTED)} best hypotheses differ"
        )
        if options.beam_size == 1:
            assert [t.candidates[0].score for t in theirs] == pytest.approx(
                [o.candidates[0].score for o in ours], abs=1e-3
            )
    assert len({tuple(t.candidates[0].tokens) for t in ours}) >= 5, "the outputs must differ from input to input"


@pytest.fixture(scope="module")
def post_ln_run(tmp_path_factory):
    """A tiny trained run with the other choices: post-LN, learned positions, separate vocabularies."""
    run = tmp_path_factory.mktemp("post-ln")
    result = train_tiny(
        run,
        "model.norm=post",
        "model.positions=learned",
        "tokenizer.joint=false",
        "model.share_embeddings=false",
        "tokenizer.vocab_size=1500",
        "train.valid_bleu=false",
        "train.max_steps=30",
        "train.valid_every=30",
    )
    assert result.exit_code == 0, result.output
    return run


# post_ln_run trains a model of its own (slow); trained_run is shared with the fast tests
@pytest.mark.parametrize("which", ["trained_run", pytest.param("post_ln_run", marks=pytest.mark.slow)])
def test_a_float32_export_of_a_trained_model_translates_like_attn(tmp_path, request, which):
    """Scores too, and beam search: on a trained model padding and BOS have no probability left,
    so CTranslate2's suppressing them changes nothing (on random weights it renormalises)."""
    from attn_cli.checkpoint import load_checkpoint

    run = request.getfixturevalue(which)
    loaded = load_checkpoint(run / "checkpoints" / "best.pt")
    export(loaded.config, loaded.tokenizers, loaded.model, tmp_path / "exported", "float32", loaded.lengths)
    exported = load_exported(tmp_path / "exported", threads=1)
    sentences = [
        line for split in ("test", "valid") for line in (run / "data" / f"{split}.en").read_text().splitlines()
    ]
    engine = TorchEngine([loaded.model], loaded.tokenizers, [loaded.config], lengths=loaded.lengths)
    assert engine.max_source_tokens == exported.max_source_tokens  # long inputs are split alike
    assert exported.lengths.counts.tolist() == loaded.lengths.counts.tolist()  # and bounded alike
    # no_loops off: attn's search keeps loops out as it goes, CTranslate2 by decoding a looping
    # sentence again. With learned lengths, CTranslate2 forbids an early EOS before its softmax and
    # attn after it (its scores stay the model's log-probabilities): greedy search writes the same
    # tokens with other scores, and a beam, which ranks by those scores, may choose otherwise.
    for beam, learned in ((1, False), (1, True), (4, False)):
        options = DecodeConfig(beam_size=beam, n_best=min(beam, 2), no_loops=False, learned_lengths=learned)
        ours = translate(engine, sources_of(sentences), options)
        theirs = translate(exported, sources_of(sentences), options)
        same = sum(o.candidates[0].tokens == t.candidates[0].tokens for o, t in zip(ours, theirs))
        if beam == 1:
            assert same == len(sentences)
            if not learned:
                assert [t.candidates[0].score for t in theirs] == pytest.approx(
                    [o.candidates[0].score for o in ours], abs=1e-3
                )
        else:
            assert same >= 0.95 * len(sentences), f"{len(sentences) - same} of {len(sentences)} best hypotheses differ"
            assert all(len(t.candidates) == 2 and t.candidates[0].score >= t.candidates[1].score for t in theirs)


def test_an_export_decodes_a_looping_sentence_again_without_the_loop(served_checkpoint, tmp_path):
    """On a random model, which mostly writes the same few tokens over and over."""
    from support.serving import SENTENCES

    from attn_cli.checkpoint import load_checkpoint
    from attn_cli.decoding.loops import LoopVocabulary, token_loop

    loaded = load_checkpoint(served_checkpoint)
    export(loaded.config, loaded.tokenizers, loaded.model, tmp_path / "exported", "float32")
    exported = load_exported(tmp_path / "exported", threads=1)
    vocabulary = LoopVocabulary.of(loaded.tokenizers.target.piece_texts())
    sentences = SENTENCES * 2
    for beam in (1, 4):
        options = DecodeConfig(beam_size=beam, no_loops=False, learned_lengths=False)
        free = translate(exported, sources_of(sentences), options)
        looping = [t for t in free if token_loop(_ids(loaded, t), vocabulary)]
        assert looping, "the tiny model loops on some sentences, so the rule was tried"
        guarded = translate(exported, sources_of(sentences), dataclasses.replace(options, no_loops=True))
        for before, after in zip(free, guarded):
            assert not token_loop(_ids(loaded, after), vocabulary)
            if before not in looping:
                assert after.text == before.text, "a sentence that did not loop is left as it was"


def _ids(loaded, translation) -> list[int]:
    return [loaded.tokenizers.target.piece_to_id(piece) for piece in translation.candidates[0].tokens]


def test_the_exported_directory_translates_on_its_own(trained_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    runner = CliRunner()
    exported = tmp_path / "exported"
    result = runner.invoke(app, ["export", "--run", str(run), "--output", str(exported), "--quantization", "float32"])
    assert result.exit_code == 0, result.output
    sentences = ["Hello.", "", "Tom is here."]
    before = runner.invoke(app, ["translate", "--run", str(run), "--format", "jsonl", *sentences])
    shutil.rmtree(run)
    after = runner.invoke(app, ["translate", "--model", str(exported), "--format", "jsonl", *sentences])
    assert before.exit_code == after.exit_code == 0, after.output
    assert [line for line in after.stdout.splitlines()] and len(after.stdout.splitlines()) == 3
    assert _texts(after.stdout) == _texts(before.stdout)
    assert "warning" not in after.stderr  # no rule of attn's search was asked for that CTranslate2 lacks
    warned = runner.invoke(app, ["translate", "--model", str(exported), "--no-stutter", "Hello."])
    assert warned.exit_code == 0 and warned.stderr.count("\n") == 1, warned.output
    assert "--no-stutter: CTranslate2 searches on its own and cannot keep to decode.no_stutter" in warned.stderr
    assert "--allow-stutter" in warned.stderr
    refused = runner.invoke(app, ["translate", "--model", str(exported), "--prefix", "我", "Hello."])
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.output
    assert "--prefix: CTranslate2 does not force a prefix" in refused.stderr
    assert "use --run or --checkpoint instead of --model" in refused.stderr
    (tmp_path / "terms.tsv").write_text("Tom\t汤姆\n", encoding="utf-8")
    refused = runner.invoke(
        app, ["translate", "--model", str(exported), "--glossary", str(tmp_path / "terms.tsv"), "Tom."]
    )
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.output
    assert "--glossary: CTranslate2 has no constrained search to place terms" in refused.stderr
    assert "use --run or --checkpoint instead of --model" in refused.stderr
    (tmp_path / "src.en").write_text("Tom.\n", encoding="utf-8")
    (tmp_path / "ref.zh").write_text("汤姆。\n", encoding="utf-8")
    evaluated = ["eval", "--model", str(exported), "--src", str(tmp_path / "src.en"), "--ref", str(tmp_path / "ref.zh")]
    refused = runner.invoke(app, [*evaluated, "--glossary", str(tmp_path / "terms.tsv")])  # eval refuses alike
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.output
    assert "--glossary: CTranslate2 has no constrained search to place terms" in refused.stderr
    int8 = runner.invoke(
        app, ["export", "--checkpoint", str(exported.parent / "missing.pt"), "--output", str(tmp_path / "int8")]
    )
    assert int8.exit_code == 2 and "checkpoint not found" in int8.output


def _texts(jsonl: str) -> list:
    import json

    return [[t["tokens"] for t in json.loads(line)["n_best"]] for line in jsonl.splitlines()]


def test_export_refusals_are_one_line(trained_run, tmp_path, monkeypatch):
    runner = CliRunner()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine\n")
    cases = [
        (["--run", str(trained_run), "--output", str(taken)], "already exists and is not an empty directory"),
        (["--run", str(tmp_path / "no-run"), "--output", str(tmp_path / "x")], "no checkpoint in"),
        (
            ["--run", str(trained_run), "--output", str(tmp_path / "y"), "--quantization", "int3"],
            "is not one CTranslate2 offers",
        ),
    ]
    for args, expected in cases:
        result = runner.invoke(app, ["export", *args])
        assert result.exit_code == 2 and expected in result.output and "Traceback" not in result.output, result.output
    assert (taken / "notes.txt").read_text() == "mine\n" and not (tmp_path / "y").exists()
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if it were not installed
    result = runner.invoke(app, ["export", "--run", str(trained_run), "--output", str(tmp_path / "z")])
    assert result.exit_code == 2 and 'pip install "attn-cli[ct2]"' in result.output
    result = runner.invoke(app, ["translate", "--model", str(tmp_path / "z"), "Hello."])
    assert result.exit_code == 2 and 'pip install "attn-cli[ct2]"' in result.output


def test_exporting_leaves_the_model_as_it_was(tmp_path):
    cfg, tokenizers, model = _random_model(
        ModelConfig(d_model=32, num_heads=4, ffn_dim=64, encoder_layers=1, decoder_layers=1, dropout=0.0), True
    )
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    for quantization in ("int8", "float16", "bfloat16"):
        export(cfg, tokenizers, model, tmp_path / quantization, quantization)
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


def test_sampling_with_a_seed_repeats(tmp_path):
    cfg, tokenizers, model = _random_model(
        ModelConfig(d_model=32, num_heads=4, ffn_dim=64, encoder_layers=1, decoder_layers=1, dropout=0.0), True
    )
    export(cfg, tokenizers, model, tmp_path / "exported", "float32")
    options = DecodeConfig(sample=True, n_best=3, seed=7, max_len_b=5, max_len_a=1.0)

    def sampled():  # as two runs of attn translate --sample --seed 7 would
        exported = load_exported(tmp_path / "exported", threads=1)
        return translate(exported, sources_of(TESTED[:5]), options)

    def pieces(translations):
        return [[candidate.tokens for candidate in t.candidates] for t in translations]

    first, again = sampled(), sampled()
    assert pieces(first) == pieces(again) and all(len(t.candidates) == 3 for t in first)


def test_outputs_stop_where_the_exported_positions_end(tmp_path):
    from attn_cli.engines.ctranslate2 import SINUSOIDAL_ROWS

    cfg, tokenizers, model = _random_model(
        ModelConfig(d_model=32, num_heads=4, ffn_dim=64, encoder_layers=1, decoder_layers=1, dropout=0.0), True
    )
    export(cfg, tokenizers, model, tmp_path / "exported", "float32")
    exported = load_exported(tmp_path / "exported", threads=1)
    options = DecodeConfig(beam_size=1, max_len_b=SINUSOIDAL_ROWS + 100)  # beyond the table, which attn lacks
    (translation,) = translate(exported, sources_of(["sentence number 3"]), options)
    assert len(translation.candidates[0].tokens) <= SINUSOIDAL_ROWS - 1


def test_an_export_that_predates_add_source_eos_is_given_the_eos(tmp_path):
    """Exports now have CTranslate2 add the source EOS (as Argos Translate, passing pieces alone,
    needs); one made before, without the setting, gets it with the source and translates alike."""
    cfg, tokenizers, model = _random_model(
        ModelConfig(d_model=32, num_heads=4, ffn_dim=64, encoder_layers=1, decoder_layers=1, dropout=0.0), True
    )
    export(cfg, tokenizers, model, tmp_path / "exported", "float32")
    options = DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=5)

    def translated():
        exported = load_exported(tmp_path / "exported", threads=1)
        found = translate(exported, sources_of(TESTED), options)
        return exported.adds_source_eos, [t.candidates[0].tokens for t in found]

    adds, tokens = translated()
    config = tmp_path / "exported" / "config.json"
    config.write_text(config.read_text().replace('"add_source_eos": true', '"add_source_eos": false'))
    adds_before, tokens_before = translated()
    assert adds and not adds_before and tokens == tokens_before
    assert len({tuple(t) for t in tokens}) >= 5


def test_a_batch_with_learned_lengths_decodes_each_sentence_within_its_own_bounds(tmp_path, monkeypatch):
    """CTranslate2 takes one floor and limit per call: the batch goes in with the widest, and the
    sentences outside their own are decoded again. Greedy, that is each sentence decoded alone."""
    import numpy as np

    from attn_cli.data.lengths import LengthModel
    from attn_cli.engines.ctranslate2 import CTranslate2Engine

    cfg, tokenizers, model = _random_model(
        ModelConfig(d_model=32, num_heads=4, ffn_dim=64, encoder_layers=1, decoder_layers=1, dropout=0.0), True
    )
    generator = np.random.default_rng(0)
    sources = generator.integers(1, 30, 4000)
    lengths = LengthModel.fit(sources, np.round(sources * 0.7 + generator.normal(0, 0.5, 4000)).astype(int))
    export(cfg, tokenizers, model, tmp_path / "exported", "float32", lengths)
    exported = load_exported(tmp_path / "exported", threads=1)
    calls = []
    translate_batch = CTranslate2Engine._translate
    monkeypatch.setattr(
        CTranslate2Engine,
        "_translate",
        lambda self, batch, *rest: calls.append(len(batch)) or translate_batch(self, batch, *rest),
    )
    options = DecodeConfig(beam_size=1, max_len_a=2.0, max_len_b=10, no_loops=False)
    together = translate(exported, sources_of(TESTED), options)
    assert calls[0] == len(TESTED) and len(calls) > 1, "one call for the batch, then the sentences outside their bounds"
    alone = [translate(exported, sources_of([sentence]), options)[0] for sentence in TESTED]
    assert [t.candidates[0].tokens for t in together] == [a.candidates[0].tokens for a in alone]
    source_lengths = [len(ids) for ids in tokenizers.source.encode(TESTED)]
    floors, longest = lengths.bounds(source_lengths)
    for translation, n, floor, limit in zip(together, source_lengths, floors.tolist(), longest.tolist()):
        assert floor <= len(translation.candidates[0].tokens) <= min(limit, int(2.0 * n) + 10)
