"""attn: train and run Transformer translation models from one YAML config."""


def package_version() -> str:
    """The version pip installed attn at (pyproject.toml's), or "0+unknown" when attn runs from a
    checkout that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attn-cli")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str) -> str:
    # __version__ is read from the package metadata when asked for, not on every import.
    if name == "__version__":
        return package_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
