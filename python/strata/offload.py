"""OffloadOptimizer: a torch.optim.Optimizer whose fp32 master weights and Adam moments live where
the strata config puts them (host memory or the NVMe store) and are updated by strata's CPU Adam.

Each parameter is one Engine unit (tensor "value"). step() hands every param.grad to the Engine
(Engine.reduce_grads: averaged over ranks under mpirun, summed in fp32 into this rank's shard),
runs Engine.step (global-norm clipping at [optimizer] grad_clip, then AdamW on every shard), and
copies the updated fp32 weights back into each parameter, cast to its dtype and device. A
contiguous fp32 CPU gradient is handed over in place; any other (CUDA, bf16, strided) goes through
one reusable staging buffer of the largest parameter's size, pinned when CUDA is available.

Parameters that do not require grad (frozen) get no unit and are never touched.

Under mpirun every rank holds the whole model and its own data (data parallel); strata shards the
optimizer state across ranks. Differences from torch.optim.AdamW: parameters whose .grad is None
are stepped with a zero gradient (their moments decay and weight decay applies).

Param groups: each group's lr, betas, eps and weight_decay are its parameters' units' overrides in
the Engine (Engine.set_unit_hyperparams), handed over again whenever they change, checked at every
step(): LR schedulers (StepLR, LambdaLR, ...) and code that edits group values work as with
torch.optim.AdamW. A config that sets [optimizer] warmup_steps or a decaying schedule scales every
group's lr by the same warm-up and decay (runtime/config/unit_hyperparams.hpp). last_step["lr"] is the
first group's rate. The overrides are not part of strata checkpoints: they come from
param_groups, which load_state_dict() restores and the constructor sets on resume.
"""

import torch

from strata import _strata
from strata._config import engine_config
from strata._engine_optimizer import EngineOptimizer, float_tensor


class OffloadOptimizer(EngineOptimizer):
    def __init__(self, params, lr=None, betas=None, eps=None, weight_decay=None, *, config=None,
                 grad_clip=None, resume=False):
        """config: a TOML file's path, a dict of TOML sections, or None for strata's defaults;
        lr, betas, eps, weight_decay and grad_clip override its [optimizer] section. resume: take
        master weights, moments and the step from the NVMe store of a previous run with the same
        config and parameters (optimizer state homed on NVMe), and copy them into the params."""
        cfg = engine_config(config, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                            grad_clip=grad_clip)
        # torch holds the working parameters; the Engine's copy only carries the update back,
        # so it is kept in fp32 and cast to each parameter's dtype here.
        cfg.precision.params = _strata.DType.fp32
        super().__init__(params, cfg)
        self.engine = _strata.Engine(cfg, resume=resume)
        self._units = []  # (parameter, unit id)
        for g, group in enumerate(self.param_groups):
            for i, param in enumerate(group["params"]):
                if param.numel() == 0 or not param.requires_grad:
                    continue  # torch would never step it either
                if param.is_complex() or param.layout != torch.strided:
                    raise ValueError(f"{_where(g, i, param)} is {param.dtype}, "
                                     f"{param.layout}: OffloadOptimizer takes real dense "
                                     "parameters")
                # Decay on: the group's weight_decay override sets its value, 0 included.
                unit = self.engine.add_unit(f"group{g}.param{i}",
                                            [("value", [param.numel()], True)])
                self._units.append((param, unit))
                self._group_units[g].append(unit)
        self._sync_hyperparameters()
        self.engine.finalize()
        largest = max((param.numel() for param, _ in self._units), default=0)
        self._staging = torch.empty(largest, dtype=torch.float32,
                                    pin_memory=torch.cuda.is_available())
        if not resume:
            self._set_masters()
        self._after_update()  # every rank's params become the Engine's (rank 0's or the store's)

    def _configure(self, optimizer):
        """The config takes the first group's values (what last_step reports); every group's own
        values are its units' overrides (_sync_hyperparameters)."""
        lr, beta1, beta2, eps, decay = _group_values(0, self.param_groups[0])
        optimizer.lr, optimizer.beta1, optimizer.beta2, optimizer.eps = lr, beta1, beta2, eps
        optimizer.weight_decay = decay
        self._engine_lr = lr
        self._group_units = [[] for _ in self.param_groups]
        self._applied = [None] * len(self.param_groups)  # the values last handed over, per group

    def _sync_hyperparameters(self):
        """Hands each group's values to its units when they changed since the last hand-over."""
        for g, group in enumerate(self.param_groups):
            values = _group_values(g, group)
            if values == self._applied[g]:
                continue
            lr, beta1, beta2, eps, decay = values
            for unit in self._group_units[g]:
                self.engine.set_unit_hyperparams(unit, lr=lr, weight_decay=decay, beta1=beta1,
                                                 beta2=beta2, eps=eps)
            self._applied[g] = values
        lr = float(self.param_groups[0]["lr"])
        if lr != self._engine_lr:
            self.engine.set_learning_rate(lr)
            self._engine_lr = lr

    def state_shard(self, param, kind="exp_avg"):
        """This rank's shard of param's "master", "exp_avg" or "exp_avg_sq" (a copy), read from
        wherever it lives; the whole tensor, flattened, on one rank."""
        for candidate, unit in self._units:
            if candidate is param:
                return float_tensor(self.engine.state_shard(unit, kind))
        raise KeyError("the parameter is not managed by this optimizer")

    def close(self):
        """Releases the Engine now (memory, the NVMe store's files stay for resume)."""
        self.engine.close()

    @torch.no_grad()
    def _set_masters(self):
        for param, unit in self._units:
            values = self._host_fp32(param)
            _strata.broadcast_floats(values.data_ptr(), values.numel(), 0)  # rank 0's weights
            self.engine.set_master(unit, values.data_ptr(), values.numel())

    def _hand_gradients(self):
        self._check_gradients()  # before any reaches the Engine, which sums what it is handed
        for param, unit in self._units:
            grad = param.grad
            if grad is None:
                grad = self._staging[:param.numel()].zero_()
            else:
                grad = self._host_fp32(grad)
            self.engine.reduce_grads(unit, grad.data_ptr(), grad.numel())

    def _check_gradients(self):
        for g, group in enumerate(self.param_groups):
            for i, param in enumerate(group["params"]):
                if param.grad is not None and param.grad.layout != torch.strided:
                    raise ValueError(f"{_where(g, i, param)} has a {param.grad.layout} gradient: "
                                     "OffloadOptimizer takes dense gradients")

    @torch.no_grad()
    def _after_update(self):
        for param, unit in self._units:
            gathered = self.engine.gather(unit)
            param.copy_(torch.frombuffer(gathered, dtype=torch.float32).view(param.shape))
            del gathered  # the view above is gone too: the Engine may reuse the memory

    def _host_fp32(self, tensor):
        """tensor itself when it is contiguous fp32 in CPU memory, else its copy in the staging
        buffer (valid until the next call)."""
        if tensor.device.type == "cpu" and tensor.dtype == torch.float32 and tensor.is_contiguous():
            return tensor
        staged = self._staging[:tensor.numel()]
        staged.copy_(tensor.reshape(-1))
        return staged


def _where(group, index, param):
    """A parameter as errors name it: its unit's name, its place in param_groups, its shape."""
    return (f"parameter group{group}.param{index} (param_groups[{group}]['params'][{index}], "
            f"shape {tuple(param.shape)})")


def _group_values(index, group):
    """(lr, beta1, beta2, eps, weight_decay) of param_groups[index] as floats; the Engine checks
    their ranges and names the unit."""
    try:
        beta1, beta2 = group["betas"]
        return tuple(float(value) for value in
                     (group["lr"], beta1, beta2, group["eps"], group["weight_decay"]))
    except (TypeError, ValueError) as error:
        raise ValueError(f"param_groups[{index}]: lr, eps and weight_decay must be numbers and "
                         f"betas two numbers ({error})") from None
