"""The corpora that ship inside attn, named in a config as `path: builtin:NAME` from any directory."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

BUILTIN_PREFIX = "builtin:"
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
