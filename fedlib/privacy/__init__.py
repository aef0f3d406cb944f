"""Privacy audit of shared pruning masks (FedPrLLM App. C and beyond)."""
