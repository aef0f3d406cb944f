"""fedlib: federated pruning of large language models (FedPrLLM and FedSpaLLM)."""

try:
    # setuptools-scm writes it from git at install time (pyproject.toml). Not importlib.metadata:
    # from a checkout's root it finds the build's fedlib.egg-info before the installed
    # distribution, and the two can differ (a wheel built since the install rewrites the first).
    from fedlib._version import __version__
except ImportError:  # a source tree on PYTHONPATH, never installed
    __version__ = "0+unknown"
