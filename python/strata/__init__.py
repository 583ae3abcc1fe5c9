"""strata for Python: the runtime's ZeRO-3 Engine (sharding, host and NVMe tiers, the CPU
optimizer) behind PyTorch's interfaces. `strata.torch` holds the PyTorch side:
OffloadOptimizer and wrap(). docs/python.md describes both."""

from strata._strata import ConfigError, backend, load_config, parse_config, rank, world_size

__all__ = ["ConfigError", "backend", "load_config", "parse_config", "rank", "world_size"]
