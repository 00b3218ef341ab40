"""The local `evaluate` module "perplexity" (its script is perplexity.py; load it with hf_posenc.metrics.load)."""
