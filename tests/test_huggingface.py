"""attn import hf and attn export --format hf: an imported Marian model computes what Transformers
computes, an exported attn model generates in Transformers what attn decodes, and the round trip is
exact. Every model is built here; nothing touches the network."""

import random
import shutil

import pytest
import torch
import transformers
from support.marian import (
    LANGUAGE_TOKENS,
    build_marian,
    corpus_pairs,
    favour_pieces,
    source_only_pieces,
    train_marian,
)
from support.runs import train_tiny
from typer.testing import CliRunner

from attn_cli.checkpoint import load_checkpoint
from attn_cli.cli.app import app
from attn_cli.config import DecodeConfig
from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_search
from attn_cli.decoding.search import SearchSettings
from attn_cli.huggingface.marian import MarianIds, attn_rows, marian_rows
from attn_cli.vocab import EOS_ID, PAD_ID, UNK_ID

pytestmark = pytest.mark.slow  # builds and trains Marian models with Transformers

PREFIX = LANGUAGE_TOKENS[0]
LIMIT = 40  # output tokens before the forced end of sentence, in both toolkits


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    directory = build_marian(tmp_path_factory.mktemp("marian") / "opus-mt-en-zh")
    train_marian(directory)
    return directory


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("imported") / "run"
    result = cli("import", "hf", marian_dir, "--output", run, "--source-prefix", PREFIX)
    assert result.exit_code == 0, result.output
    return run


@pytest.fixture(scope="module")
def hf(marian_dir):
    model = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    return model, transformers.MarianTokenizer.from_pretrained(marian_dir)


def held_out_sentences():
    return [source for source, _ in corpus_pairs(1500)[1000:1100]]


def marian_ids_of(model):
    """attn id -> Marian id for an imported model (None for attn's padding)."""
    size = model.config.vocab_size
    return attn_rows(size, MarianIds(eos=0, unk=1, pad=size - 1, decoder_start=size - 1))


def padded(rows, pad):
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])


def test_an_imported_model_tokenizes_and_computes_the_logits_of_transformers(imported, hf):
    model, tokenizer = hf
    checkpoint = load_checkpoint(imported / "checkpoints" / "best.pt")
    to_marian = marian_ids_of(model)
    pairs = corpus_pairs(1500)[1000:1016]
    sources = checkpoint.tokenizers.encode_sources([s for s, _ in pairs])
    targets = checkpoint.tokenizers.target.encode([t for _, t in pairs])
    hf_sources = tokenizer([f"{PREFIX} {s}" for s, _ in pairs]).input_ids
    hf_targets = tokenizer(text_target=[t for _, t in pairs]).input_ids
    assert [[to_marian[i] for i in ids] + [0] for ids in sources] == hf_sources
    assert [[to_marian[i] for i in ids] + [0] for ids in targets] == hf_targets
    language_ids = checkpoint.tokenizers.source.id_to_piece([row[0] for row in sources])
    assert set(language_ids) == {PREFIX}

    start = model.config.decoder_start_token_id
    hf_src = padded(hf_sources, model.config.pad_token_id)
    hf_tgt_in = padded([[start] + t[:-1] for t in hf_targets], model.config.pad_token_id)
    with torch.no_grad():
        expected = model(
            input_ids=hf_src, attention_mask=hf_src != model.config.pad_token_id, decoder_input_ids=hf_tgt_in
        ).logits
        attn_model = checkpoint.model.eval()
        src = padded([ids + [EOS_ID] for ids in sources], PAD_ID)
        tgt_in = padded([[2] + ids for ids in targets], PAD_ID)
        logits = attn_model.decode(tgt_in, attn_model.encode(src))
    to_attn = torch.tensor([to_marian.index(m) for m in range(model.config.vocab_size)])
    for row, target in enumerate(hf_targets):
        length = len(target)  # the positions that are not padding
        difference = (logits[row, :length][:, to_attn] - expected[row, :length]).abs().max()
        assert difference < 1e-4, (row, float(difference))
    assert expected.std() > 1.0, "the logits are not trivially small"


def _search(model, src, options):
    """attn's greedy (beam 1) or beam search of the options, without output rules."""
    settings = SearchSettings.of(options)
    with torch.no_grad():
        if options.beam_size == 1:
            return greedy_search(model.eval(), src, settings)
        return beam_search(model.eval(), src, settings)


def _attn_search(checkpoint, sentences, beam):
    options = DecodeConfig(beam_size=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=LIMIT)
    ids = checkpoint.tokenizers.encode_sources(sentences)
    src = padded([row + [EOS_ID] for row in ids], PAD_ID)
    return [hypotheses[0].tokens for hypotheses in _search(checkpoint.model, src, options)]


def _generate(model, tokenizer, sentences, beams):
    batch = tokenizer([f"{PREFIX} {s}" for s in sentences], return_tensors="pt", padding=True)
    pad = model.config.pad_token_id
    with torch.no_grad():
        output = model.generate(
            **batch,
            num_beams=beams,
            do_sample=False,
            length_penalty=0.0,
            max_new_tokens=LIMIT + 1,
            bad_words_ids=[[pad]],  # the decoder start, as OPUS-MT's generation configs say
        )
    return [[t for t in row.tolist()[1:] if t != pad and t != 0] for row in output]


def test_greedy_gives_the_tokens_of_generate_and_beam_4_its_best_hypothesis(imported, hf, capsys):
    model, tokenizer = hf
    checkpoint = load_checkpoint(imported / "checkpoints" / "best.pt")
    to_marian = marian_ids_of(model)
    sentences = held_out_sentences()
    greedy = [[to_marian[t] for t in tokens] for tokens in _attn_search(checkpoint, sentences, 1)]
    expected = _generate(model, tokenizer, sentences, 1)
    assert greedy == expected
    assert len({tuple(t) for t in expected}) > 10 and min(map(len, expected)) < LIMIT, "outputs vary and end"

    beam = [[to_marian[t] for t in tokens] for tokens in _attn_search(checkpoint, sentences, 4)]
    expected_beam = _generate(model, tokenizer, sentences, 4)
    differ = sum(a != b for a, b in zip(beam, expected_beam))
    with capsys.disabled():
        print(f"\nbeam 4: {differ} of {len(sentences)} best hypotheses differ from Transformers' generate")
    assert differ <= 0.05 * len(sentences)
    assert beam != greedy, "beam search found nothing greedy did not: the comparison would be weak"


def test_pieces_only_the_source_side_has_are_written_as_marian_tokenizer_writes_them(marian_dir, imported, hf):
    """vocab.json holds the pieces of both SentencePiece models, and a model may write one that only
    the source side has (an English name in a Chinese output). The target's SentencePiece model lacks
    it and writes it as it is, ▁ and all ("我▁Tom▁Tom"); MarianTokenizer makes each ▁ a space."""
    model, tokenizer = hf
    target = load_checkpoint(imported / "checkpoints" / "best.pt").tokenizers.target
    to_marian = marian_ids_of(model)
    foreign = [target.piece_to_id(piece) for piece in source_only_pieces(marian_dir)]
    assert len(foreign) > 100 and sum(piece.startswith("▁") for piece in target.id_to_piece(foreign)) > 50
    own = sorted({i for row in target.encode([t for _, t in corpus_pairs(1500)[1000:1100]]) for i in row} - {UNK_ID})
    tom, wo, men, space, stop = (target.piece_to_id(p) for p in ("▁Tom", "▁我", "们", "▁", "。"))
    assert UNK_ID not in (tom, wo, men, space, stop)
    rows = [[wo, men, tom, tom], [tom, wo, stop], [space, tom, space], [tom], [space], []]
    draw = random.Random(0)
    rows += [[draw.choice(draw.choice((foreign, own))) for _ in range(draw.randint(1, 12))] for _ in range(300)]
    # An <unk> is left out: attn writes it (" ⁇ "), and skip_special_tokens drops it.
    ours = target.decode([row + [EOS_ID] for row in rows])
    theirs = tokenizer.batch_decode([[to_marian[i] for i in row] + [0] for row in rows], skip_special_tokens=True)
    assert ours[0] == theirs[0] == "我们 Tom Tom"
    wrong = [(a, b) for a, b in zip(ours, theirs) if a != b]
    assert not wrong, f"{len(wrong)} of {len(rows)} texts differ from MarianTokenizer's (attn's, theirs): {wrong[:4]}"


def test_a_model_that_writes_source_pieces_translates_as_transformers_decodes(marian_dir, tmp_path):
    """attn translate on an imported model whose outputs use pieces only the source side has, against
    generate and MarianTokenizer.batch_decode."""
    copy = tmp_path / "opus-mt-en-zh"
    shutil.copytree(marian_dir, copy)
    favour_pieces(copy, ["▁Tom", "▁you"], 6.0)
    result = cli("import", "hf", copy, "--output", tmp_path / "run", "--source-prefix", PREFIX)
    assert result.exit_code == 0, result.output
    sentences = held_out_sentences()[:30]
    # --allow-loops: Transformers' generate has no such rule
    limits = ["--beam", 1, "--length-penalty", 0, "--max-len-a", 0, "--max-len-b", LIMIT, "--allow-loops"]
    result = cli("translate", "--run", tmp_path / "run", *limits, *sentences)
    assert result.exit_code == 0, result.output

    model = transformers.MarianMTModel.from_pretrained(copy).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(copy)
    generated = _generate(model, tokenizer, sentences, 1)
    vocab = tokenizer.get_vocab()
    foreign = {vocab[piece] for piece in source_only_pieces(copy)}
    assert sum(any(t in foreign for t in row) and not all(t in foreign for t in row) for row in generated) > 10
    assert result.stdout.splitlines() == tokenizer.batch_decode(generated, skip_special_tokens=True)


def test_an_imported_run_fine_tunes_and_resumes_bitwise(imported, tmp_path):
    settings = [
        f"train.init_from={imported}",
        "data.max_pairs=400",
        "data.valid_size=20",
        "data.test_size=20",
        "train.valid_every=100",
        "train.valid_bleu=false",
        "train.precision=fp32",
        "train.max_tokens=512",
        "train.warmup_steps=2",
        "train.log_every=1",
    ]

    def train(run, steps, resume=False):
        args = ["train", "--config", imported / "config.yaml", "--set", f"run_dir={run}"]
        for setting in [*settings, f"train.max_steps={steps}"]:
            args += ["--set", setting]
        result = cli(*args, *(["--resume"] if resume else []))
        assert result.exit_code == 0, result.output
        return torch.load(run / "checkpoints" / "last.pt", weights_only=False)

    straight = train(tmp_path / "straight", 6)
    train(tmp_path / "resumed", 3)
    resumed = train(tmp_path / "resumed", 6, resume=True)
    assert straight["step"] == resumed["step"] == 6
    for name, tensor in straight["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
    start = torch.load(imported / "checkpoints" / "best.pt", weights_only=False)
    assert not torch.equal(straight["model"]["output_bias"], start["model"]["output_bias"]), "it trained"
    assert straight["tokenizers"] == start["tokenizers"], "the imported tokenizer, unchanged"


@pytest.fixture(scope="module")
def post_ln_run(tmp_path_factory):
    """A tiny attn model trained with the settings Marian represents."""
    run = tmp_path_factory.mktemp("post-ln") / "run"
    result = train_tiny(
        run,
        "model.norm=post",
        "model.sinusoid_layout=halves",
        "model.activation=silu",
        "model.output_bias=true",
        "train.max_steps=400",
        "train.valid_every=400",
        "train.warmup_steps=50",
        "train.keep_last=1",
        "decode.beam_size=1",
    )
    assert result.exit_code == 0, result.output
    return run


@pytest.fixture(scope="module")
def exported(post_ln_run, tmp_path_factory):
    output = tmp_path_factory.mktemp("hf") / "en-zh"
    result = cli("export", "--run", post_ln_run, "--format", "hf", "--output", output)
    assert result.exit_code == 0, result.output
    return output


def test_an_exported_model_generates_attn_s_greedy_tokens_in_transformers(post_ln_run, exported):
    checkpoint = load_checkpoint(post_ln_run / "checkpoints" / "best.pt")
    model = transformers.MarianMTModel.from_pretrained(exported).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(exported)
    to_marian = {attn: marian for marian, attn in enumerate(marian_rows(checkpoint.tokenizers.target.vocab_size))}
    sentences = (post_ln_run / "data" / "test.en").read_text(encoding="utf-8").splitlines()
    ids = checkpoint.tokenizers.encode_sources(sentences)
    assert [[to_marian[i] for i in row] + [0] for row in ids] == tokenizer(sentences).input_ids

    options = DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=LIMIT)
    found = _search(checkpoint.model, padded([r + [EOS_ID] for r in ids], PAD_ID), options)
    greedy = [[to_marian[t] for t in hypotheses[0].tokens] for hypotheses in found]
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        output = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=LIMIT + 1)
    pad = model.config.pad_token_id
    assert greedy == [[t for t in row.tolist()[1:] if t not in (pad, 0)] for row in output]
    assert len({tuple(g) for g in greedy}) > 5

    # What a Hub user runs (the model card's code): the exported generation config alone (beam 1,
    # Marian's length limit) and the tokenizer's decoding give attn's translations.
    with torch.no_grad():
        output = model.generate(**batch)
    texts = tokenizer.batch_decode(output, skip_special_tokens=True)
    limit = DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=checkpoint.config.model.max_positions - 2)
    found = _search(checkpoint.model, padded([r + [EOS_ID] for r in ids], PAD_ID), limit)
    assert texts == checkpoint.tokenizers.target.decode([f[0].tokens for f in found])
    card = (exported / "README.md").read_text(encoding="utf-8")
    assert "BLEU" in card and "chrF" in card and "CC-BY 2.0 FR" in card and "pipeline_tag: translation" in card


def test_a_round_trip_through_transformers_keeps_every_weight(post_ln_run, exported, tmp_path):
    result = cli("import", "hf", exported, "--output", tmp_path / "back")
    assert result.exit_code == 0, result.output
    original = load_checkpoint(post_ln_run / "checkpoints" / "best.pt")
    back = load_checkpoint(tmp_path / "back" / "checkpoints" / "best.pt")
    before, after = original.model.state_dict(), back.model.state_dict()
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), name
    sentences = ["I love you.", "Where is the station?"]
    assert back.tokenizers.encode_sources(sentences) == original.tokenizers.encode_sources(sentences)


def test_a_model_transformers_cannot_represent_is_refused_in_one_line(trained_run, tmp_path):
    """configs/tiny.yaml trains pre-LN with interleaved sinusoids: no Marian model computes that."""
    result = cli("export", "--run", trained_run, "--format", "hf", "--output", tmp_path / "out")
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "pre-LN" in result.output and "model.norm: post" in result.output
    assert not (tmp_path / "out").exists()


def test_a_multi_target_model_needs_its_language_token(marian_dir, tmp_path):
    result = cli("import", "hf", marian_dir, "--output", tmp_path / "run")
    assert result.exit_code == 2 and "--source-prefix '>>cmn_Hans<<'" in result.output
    result = cli("import", "hf", marian_dir, "--output", tmp_path / "run", "--source-prefix", ">>fra<<")
    assert result.exit_code == 2 and ">>yue_Hant<<" in result.output
    copy = tmp_path / "broken"
    shutil.copytree(marian_dir, copy)
    (copy / "vocab.json").unlink()
    result = cli("import", "hf", copy, "--output", tmp_path / "run")
    assert result.exit_code == 2 and "lacks vocab.json" in result.output
    assert not (tmp_path / "run").exists()


def test_a_hub_id_offline_is_one_line(tmp_path, monkeypatch):
    """Offline (as here, and as HF_HUB_OFFLINE=1 says), a Hub id is one line naming what to do."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no cached copy to fall back on
    monkeypatch.chdir(tmp_path)
    result = cli("import", "hf", "Helsinki-NLP/opus-mt-en-zh", "--output", tmp_path / "run")
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 2 and "could not fetch Helsinki-NLP/opus-mt-en-zh" in lines[1], result.output
    assert "huggingface-cli download" in lines[1] and not (tmp_path / "run").exists()


def test_an_imported_run_exports_to_ctranslate2_and_translates_alike(imported, tmp_path):
    """The source prefix and the vocabulary of its own reach the CTranslate2 export."""
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    result = cli("export", "--run", imported, "--output", tmp_path / "ct2", "--quantization", "float32")
    assert result.exit_code == 0, result.output
    sources = [Source(sentence) for sentence in held_out_sentences()[:30]]
    options = DecodeConfig(beam_size=1)
    ours = [t.text for t in translate(load_engine([imported], [], None, "cpu"), sources, options)]
    exported = [t.text for t in translate(load_engine([], [], tmp_path / "ct2", "cpu"), sources, options)]
    assert exported == ours
    assert len(set(ours)) > 5


def test_a_config_without_a_key_attn_needs_names_it(marian_dir, tmp_path):
    import json

    copy = tmp_path / "model"
    shutil.copytree(marian_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    del config["pad_token_id"]
    (copy / "config.json").write_text(json.dumps(config))
    result = cli("import", "hf", copy, "--output", tmp_path / "run", "--source-prefix", PREFIX)
    assert result.exit_code == 2 and "has no 'pad_token_id'" in result.output, result.output


def test_every_part_of_a_long_input_starts_with_the_source_prefix_and_an_empty_line_stays_empty(imported):
    from attn_cli.decoding.parts import split_sources
    from attn_cli.decoding.pipeline import translate_prepared
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    engine = load_engine([imported], [], None, "cpu")
    long_input = " ".join(held_out_sentences()[:40])  # beyond the 127 tokens the model takes at once
    prefix = engine.tokenizers.source.piece_to_id(PREFIX)
    limit = engine.config.model.max_sequence_tokens
    options = DecodeConfig(beam_size=1)
    prepared = split_sources(engine, [Source(long_input), Source("")], options)
    long, empty = prepared
    assert len(long.parts) > 1 and all(part.ids[0] == prefix for part in long.parts)
    assert all(len(part.ids) <= limit for part in long.parts)
    assert not empty.parts
    translations = translate_prepared(engine, prepared, options)
    assert [note.kind for note in translations[0].notes] == ["split"]
    assert [c.text for c in translations[1].candidates] == [""]


def test_an_output_layer_not_tied_to_the_embeddings_is_refused(marian_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "untied"
    shutil.copytree(marian_dir, copy)
    weights = load_file(copy / "model.safetensors")
    weights["lm_head.weight"] = torch.randn_like(weights["model.shared.weight"])
    save_file(weights, copy / "model.safetensors")
    result = cli("import", "hf", copy, "--output", tmp_path / "run", "--source-prefix", PREFIX)
    assert result.exit_code == 2 and "lm_head.weight is not the shared embedding" in result.output, result.output
    (copy / "model.safetensors").write_bytes(b"not weights")
    result = cli("import", "hf", copy, "--output", tmp_path / "run", "--source-prefix", PREFIX)
    assert result.exit_code == 2 and "cannot read the weights" in result.output, result.output
