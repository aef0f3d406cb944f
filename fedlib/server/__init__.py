"""Server strategies: one module each, registered here by name."""

from fedlib.server.fedprllm import FedPrLLM
from fedlib.server.fedspallm import FedSpaLLM

STRATEGIES = {"fedprllm": FedPrLLM, "fedspallm": FedSpaLLM}
