"""What OffloadOptimizer and the ZeRO-3 wrapper's optimizer share: a torch.optim.Optimizer whose
state lives in a strata Engine, the mapping of torch's param groups onto the Engine's
hyper-parameters, and state_dict() / load_state_dict() as strata checkpoints.

Param groups, by default (the ZeRO-3 wrapper, whose units hold parameters of several groups): the
Engine's config applies one learning rate, one (betas, eps) and one weight decay, the last per
tensor on or off. So groups must agree on lr, betas and eps, and their weight_decay is either 0 or
one shared value; anything else raises ValueError naming the groups. A group's lr may change
between steps (LR schedulers) as long as every group keeps the same one: step() hands it to the
Engine (Engine.set_learning_rate), under the config's warm-up and decay if it sets them.
OffloadOptimizer (one unit per parameter) overrides this with per-unit hyper-parameters, so its
groups may differ in everything (see offload.py).
"""
import time

import torch

from strata import _checkpoint


def float_tensor(array):
    """A FloatArray the Engine returned, viewed as a 1-D fp32 tensor (torch.frombuffer refuses an
    empty buffer, which a rank whose shard of a small unit is empty gets)."""
    return torch.frombuffer(array, dtype=torch.float32) if len(array) else torch.empty(0)


def shared_hyperparameters(param_groups):
    """(lr, (beta1, beta2), eps, weight_decay) common to the groups; raises ValueError if none."""
    first = param_groups[0]
    for key in ("lr", "betas", "eps"):
        values = [group[key] for group in param_groups]
        if any(value != values[0] for value in values):
            raise ValueError(
                f"param groups differ in {key} ({', '.join(map(str, values))}): strata's Engine "
                f"applies one {key} to every parameter")
    decays = sorted({group["weight_decay"] for group in param_groups} - {0, 0.0})
    if len(decays) > 1:
        raise ValueError(
            f"param groups use weight decays {decays}: strata turns weight decay on or off per "
            "tensor at one value, so groups may only use 0 and one other value")
    return first["lr"], tuple(first["betas"]), first["eps"], (decays[0] if decays else 0.0)


class EngineOptimizer(torch.optim.Optimizer):
    """Base: subclasses build self.engine, and implement _hand_gradients() and _after_update()."""

    def __init__(self, params, config):
        optimizer = config.optimizer
        defaults = {"lr": optimizer.lr, "betas": (optimizer.beta1, optimizer.beta2),
                    "eps": optimizer.eps, "weight_decay": optimizer.weight_decay}
        self.engine = None
        super().__init__(params, defaults)
        self._configure(optimizer)
        # The Engine's StepStats of the latest step, as a dict, plus the seconds step() spent
        # handing the gradients over (hand_over_s) and writing the weights back (write_back_s).
        self.last_step = None

    def _configure(self, optimizer):
        """Sets the config's [optimizer] from the param groups, before the Engine is built."""
        lr, betas, eps, decay = shared_hyperparameters(self.param_groups)
        optimizer.lr, optimizer.eps, optimizer.weight_decay = lr, eps, decay
        optimizer.beta1, optimizer.beta2 = betas
        self._fixed = (betas, eps, decay)
        self._engine_lr = lr

    def add_param_group(self, param_group):
        if self.engine is not None:
            raise RuntimeError("strata's Engine partitions every parameter when the optimizer is "
                               "built: pass every param group to the constructor")
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparameters()
        start = time.perf_counter()
        self._hand_gradients()
        handed = time.perf_counter()
        stats = self.engine.step()
        stepped = time.perf_counter()
        self._after_update()
        stats["hand_over_s"] = handed - start
        stats["write_back_s"] = time.perf_counter() - stepped
        self.last_step = stats
        return loss

    def _sync_hyperparameters(self):
        """Hands the param groups' current values to the Engine (every step, and on load)."""
        lr, betas, eps, decay = shared_hyperparameters(self.param_groups)
        if (betas, eps, decay) != self._fixed:
            raise ValueError(
                f"betas, eps or weight_decay changed after construction ({self._fixed} -> "
                f"{(betas, eps, decay)}): strata fixes them when the Engine is built; only lr "
                "may change between steps")
        if lr != self._engine_lr:
            self.engine.set_learning_rate(lr)
            self._engine_lr = lr

    def state_dict(self):
        """Collective: torch's param_groups plus the Engine's whole state under 'strata' (a strata
        checkpoint of master weights and moments, every rank's shard, as bytes on rank 0 only)."""
        state = super().state_dict()
        state["strata"] = _checkpoint.engine_state(self.engine)
        return state

    def load_state_dict(self, state_dict):
        """Collective: restores the param groups and the Engine's state (from rank 0's
        state_dict), on any rank count."""
        if "strata" not in state_dict:
            raise ValueError("not a strata optimizer state_dict: it has no 'strata' entry "
                             "(a plain torch optimizer's state cannot seed strata's moments)")
        super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        self._sync_hyperparameters()
        _checkpoint.load_engine_state(self.engine, state_dict["strata"])
        self._after_update()

    def _hand_gradients(self):
        raise NotImplementedError

    def _after_update(self):
        raise NotImplementedError
