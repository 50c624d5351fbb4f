"""The repository stands on its own: nothing in it points outside it."""

import subprocess

from support.runs import REPO


def test_no_tracked_file_points_at_a_shared_folder_beside_the_repository():
    outside = "../" + "shared"  # spelled apart, so this file does not find itself
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert files, "git ls-files listed nothing"
    mentioning = [
        name
        for name in files
        if (REPO / name).is_file() and outside in (REPO / name).read_bytes().decode("utf-8", "replace")
    ]
    assert mentioning == []


def test_the_development_set_shares_no_sentence_with_the_built_in_corpus():
    """Settings chosen on it, and scores measured on it, are of sentences the model never trained on."""
    import lzma

    corpus = (REPO / "attn_cli" / "corpora" / "tatoeba-cmn-eng" / "cmn.txt.xz").read_bytes()
    english, chinese = set(), set()
    for line in lzma.decompress(corpus).decode("utf-8-sig").splitlines():
        if "\t" not in line:
            continue
        source, target = line.split("\t")[:2]
        english.add(source.strip())
        chinese.add(target.strip())
    dev = REPO / "benchmarks" / "en-zh-dev"
    sources = (dev / "dev.en").read_text(encoding="utf-8").splitlines()
    references = (dev / "dev.zh").read_text(encoding="utf-8").splitlines()
    assert len(sources) == len(references) == 2039
    assert not english & set(sources)
    assert not chinese & set(references)
