"""fedlib: federated pruning of large language models (FedPrLLM and FedSpaLLM)."""

from importlib.metadata import PackageNotFoundError, version

try:
    # setuptools-scm sets it from the git tag at install time (pyproject.toml)
    __version__ = version("fedlib")
except PackageNotFoundError:  # a source tree on PYTHONPATH, never installed
    __version__ = "0+unknown"
