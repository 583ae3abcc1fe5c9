"""strata for PyTorch (docs/python.md).

  OffloadOptimizer(params, lr=..., config=...)   a torch.optim.Optimizer: fp32 master weights and
                                                 Adam moments on the host or NVMe tier, updated
                                                 by strata's CPU Adam.
  wrap(model, config, units=[...])               ZeRO-3 for a torch model: each unit's parameters
                                                 sharded across ranks and offloaded; returns a
                                                 handle whose .optimizer steps it.
"""

from strata.offload import OffloadOptimizer
from strata.zero3 import Zero3, Zero3Optimizer, wrap

__all__ = ["OffloadOptimizer", "Zero3", "Zero3Optimizer", "wrap"]
