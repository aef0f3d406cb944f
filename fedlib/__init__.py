"""fedlib: federated pruning of large language models (FedPrLLM and FedSpaLLM)."""

__version__ = "0.1.0"
