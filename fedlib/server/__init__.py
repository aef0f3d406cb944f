"""Server strategies: one module each, registered here by name."""

from fedlib.server.fedprllm import FedPrLLM

STRATEGIES = {"fedprllm": FedPrLLM}
