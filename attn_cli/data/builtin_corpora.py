"""The corpora that ship inside attn, named in a config as `path: builtin:NAME` from any directory."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Optional

from attn_cli.config import BUILTIN_PREFIX  # noqa: F401 (what corpus paths of this module begin with)

# Name -> file under attn_cli/corpora/.
_CORPORA = {"tatoeba-cmn-eng": "tatoeba-cmn-eng/cmn.txt.xz"}


def corpus_names() -> list[str]:
    return sorted(_CORPORA)


def corpus_file(path: str) -> str:
    """`path` itself, or the packaged file of a `builtin:NAME` path (KeyError for an unknown NAME)."""
    if not path.startswith(BUILTIN_PREFIX):
        return path
    name = path[len(BUILTIN_PREFIX) :]
    return str(Path(str(resources.files("attn_cli"))) / "corpora" / _CORPORA[name])


def corpus_readme(path: str) -> Optional[str]:
    """The README of a `builtin:NAME` corpus (its source, licence and the attribution it asks
    for); None for any other path."""
    if not path.startswith(BUILTIN_PREFIX) or path[len(BUILTIN_PREFIX) :] not in _CORPORA:
        return None
    return (Path(corpus_file(path)).parent / "README.md").read_text(encoding="utf-8")
