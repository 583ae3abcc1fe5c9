"""wrap(): ZeRO-3 for a torch model on strata's Engine.

Each listed submodule (say, every decoder layer) becomes one Engine unit, and the model's other
trainable parameters (embeddings, final norm, head) one more, the root unit. The Engine shards
every unit's parameters, gradients and optimizer state across ranks and homes each on the tier the
config names; torch keeps only empty placeholders. Around each use:

  forward    a pre-hook gathers the unit and points its parameters' .data at views of the gathered
             fp32 values; the forward hook releases it. Tensors autograd saves that live in gathered
             memory (a weight, or a transposed view of one) are saved as (unit, offset, shape,
             strides) instead, through torch.autograd.graph.saved_tensors_hooks, so no view of a
             released unit survives.
  backward   an identity autograd function at the unit's output runs first: it re-gathers the unit
             and points each parameter's .grad at its slice of one flat fp32 buffer, into which
             autograd accumulates in place. When every parameter's gradient has arrived (a hook on
             its AccumulateGrad node), the buffer goes to Engine.reduce_grads (averaged over ranks)
             and the unit is released. Saved views are rebuilt from the re-gathered unit.
  step       optimizer.step() hands over what is left (parameters that got no gradient count as
             zero) and runs Engine.step: global-norm clipping and AdamW on every shard.

Under `mpirun -np N` every rank runs the same model on its own micro-batch; gathers and
reductions are collective, so every rank must run the same forward and backward. Limits: the model
and its trainable parameters are fp32 on the CPU, a unit's parameters belong to it alone (shared
weights live in one unit or the root), and units do not nest.
"""

import torch

from strata import _strata
from strata._config import engine_config
from strata._engine_optimizer import EngineOptimizer, float_tensor


def wrap(model, config=None, units=(), *, lr=None, betas=None, eps=None, weight_decay=None,
         grad_clip=None, grad_accumulation=1, resume=False, no_weight_decay=None):
    """ZeRO-3 for `model` (hooked in place); returns the Zero3 handle, whose .optimizer steps it.

    config: a TOML path, a dict of TOML sections or None; lr, betas, eps, weight_decay and
    grad_clip override its [optimizer]. units: submodules to shard one by one. grad_accumulation:
    backward passes per optimizer step (scale each loss by 1/grad_accumulation for a mean).
    resume: continue from the NVMe store of an earlier run of the same model and config.
    no_weight_decay(name, param) -> True exempts a parameter from weight decay."""
    return Zero3(model, config, units, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                 grad_clip=grad_clip, grad_accumulation=grad_accumulation, resume=resume,
                 no_weight_decay=no_weight_decay)


class Zero3:
    """What wrap() returns: .model (hooked in place), .optimizer, .engine, .units (one _Unit per
    Engine unit, in unit order), and the collective full_state_dict(), save(), load()."""

    def __init__(self, model, config, units, *, grad_accumulation, resume, no_weight_decay,
                 **overrides):
        cfg = engine_config(config, **overrides)
        self.model = model
        self._grad_accumulation = grad_accumulation
        self._gathered = set()  # units whose values are gathered now
        groups = _unit_parameters(model, list(units))
        params = [param for _, slots in groups for _, param in slots]
        self.optimizer = Zero3Optimizer(self, params, cfg)  # settles the hyper-parameters
        self.engine = _strata.Engine(cfg, resume=resume, grad_accumulation=grad_accumulation)
        self.optimizer.engine = self.engine
        decay = no_weight_decay or (lambda name, param: False)
        self.units = []
        for name, slots in groups:
            tensors = [(slot_name, list(param.shape) or [1], not decay(slot_name, param))
                       for slot_name, param in slots]
            self.units.append(_Unit(self, self.engine.add_unit(name, tensors), name, slots))
        self.engine.finalize()
        for unit in self.units:
            if not resume:
                unit.set_master_from_torch()
            unit.drop_torch_values()
        self._install_hooks()

    def full_state_dict(self):
        """Collective: {parameter name: full fp32 master weights}, gathered from every rank."""
        state = {}
        for unit in self.units:
            flat = float_tensor(self.engine.gather_master(unit.id))
            for slot in unit.slots:
                state[slot.name] = flat[slot.offset:slot.offset + slot.numel].view(slot.shape)
        return state

    def save(self, directory):
        """Collective: a strata checkpoint of the whole training state (docs/reliability.md)."""
        self.engine.save(str(directory))

    def load(self, directory):
        """Collective: restores a checkpoint saved by save(), on any rank count."""
        self.engine.load(str(directory))

    def close(self):
        for unit in self.units:
            unit.release()
        self.engine.close()

    # Saved-tensor hooks: a tensor in gathered memory is saved as where it lies, not as a view.
    def _pack(self, tensor):
        if (self._gathered and tensor.dtype == torch.float32 and tensor.device.type == "cpu"
                and tensor.layout == torch.strided):
            address = tensor.data_ptr()
            for unit in self._gathered:
                if unit.address <= address < unit.end:
                    return _SavedSlice(unit, (address - unit.address) // 4, tensor.size(),
                                       tensor.stride())
        return tensor

    @staticmethod
    def _unpack(saved):
        if isinstance(saved, _SavedSlice):
            return saved.unit.gather().as_strided(saved.size, saved.stride, saved.offset)
        return saved

    def _install_hooks(self):
        root = None
        for unit in self.units:
            if unit.module is None:
                root = unit
            else:
                unit.module.register_forward_pre_hook(unit.before_forward)
                unit.module.register_forward_hook(unit.after_forward)
        forward = self.model.forward

        def sharded_forward(*args, **kwargs):
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                try:
                    if root is not None:
                        root.gather()
                    output = forward(*args, **kwargs)
                    return root.attach(output) if root is not None else output
                finally:
                    for unit in list(self._gathered):
                        unit.release()

        self.model.forward = sharded_forward

    def _flush(self):
        for unit in self.units:
            unit.flush(self._grad_accumulation)


class Zero3Optimizer(EngineOptimizer):
    """optimizer.step() runs Engine.step over every unit of the wrapped model."""

    def __init__(self, zero, params, config):
        super().__init__(params, config)
        self._zero = zero

    def zero_grad(self, set_to_none=True):
        """Nothing to clear: gradients go to strata during backward and step() consumes them."""

    def _hand_gradients(self):
        self._zero._flush()

    def _after_update(self):
        pass  # the next forward gathers the updated parameters


class _Slot:
    """One parameter's place in its unit's flat values."""

    def __init__(self, name, param, offset):
        self.name, self.param, self.offset = name, param, offset
        self.shape, self.numel = param.shape, param.numel()
        with torch.enable_grad():  # the node autograd accumulates this parameter's gradient in
            self.accumulator = param.expand_as(param).grad_fn.next_functions[0][0]


class _Unit:
    def __init__(self, zero, unit_id, name, named_params):
        self.zero, self.engine, self.id, self.name = zero, zero.engine, unit_id, name
        self.module = named_params.module
        self.slots = []
        offset = 0
        for param_name, param in named_params:
            self.slots.append(_Slot(param_name, param, offset))
            offset += param.numel()
        self.numel = offset
        for index, slot in enumerate(self.slots):
            slot.accumulator.register_hook(
                lambda grad_inputs, grad_outputs, index=index: self.on_accumulated(index))
        self.gathered = None  # the Engine's GatheredUnit while gathered
        self.flat = None      # its fp32 values as a tensor
        self.address = self.end = 0
        self.grad = None      # the flat gradient buffer while gradients arrive
        self.waiting = set()  # slots whose gradient has not arrived in this backward
        self.reductions = 0   # reduce_grads calls since the last step

    # Values -------------------------------------------------------------------------------------
    def set_master_from_torch(self):
        values = torch.cat([slot.param.detach().reshape(-1) for slot in self.slots])
        _strata.broadcast_floats(values.data_ptr(), values.numel(), 0)  # rank 0's weights
        self.engine.set_master(self.id, values.data_ptr(), values.numel())

    def drop_torch_values(self):
        for slot in self.slots:
            slot.param.data = _placeholder()

    def gather(self):
        if self.flat is None:
            self.gathered = self.engine.gather(self.id)
            self.flat = torch.frombuffer(self.gathered, dtype=torch.float32)
            self.address = self.flat.data_ptr()
            self.end = self.address + 4 * self.numel
            for slot in self.slots:
                slot.param.data = self._slice(self.flat, slot)
            self.zero._gathered.add(self)
        return self.flat

    def release(self):
        if self.flat is None:
            return
        self.drop_torch_values()
        self.flat = self.gathered = None  # the last references: the Engine releases the unit
        self.zero._gathered.discard(self)

    # Forward ------------------------------------------------------------------------------------
    def before_forward(self, module, inputs):
        self.gather()

    def after_forward(self, module, inputs, output):
        output = self.attach(output)
        if self.grad is None:  # else a recomputation inside the backward (checkpointing)
            self.release()
        return output

    def attach(self, output):
        """output, with an identity autograd function in front of the unit's backward."""
        if not torch.is_grad_enabled():
            return output
        if isinstance(output, torch.Tensor):
            return _OpenGradients.apply(self, output) if output.requires_grad else output
        if isinstance(output, (tuple, list)):
            items = [self.attach(item) for item in output]
            return type(output)(*items) if hasattr(output, "_fields") else type(output)(items)
        if isinstance(output, dict):
            for key, value in output.items():
                output[key] = self.attach(value)
        return output

    # Backward -----------------------------------------------------------------------------------
    def open_gradients(self):
        """Gathers the unit and points every parameter's .grad at its slice of one buffer."""
        self.gather()
        if self.grad is None:
            self.grad = torch.zeros(self.numel, dtype=torch.float32)
            for slot in self.slots:
                slot.param.grad = self._slice(self.grad, slot)
            self.waiting = set(range(len(self.slots)))

    def on_accumulated(self, index):
        slot = self.slots[index]
        if self.grad is None:  # no output of this unit carried the gradient (see attach)
            self.grad = torch.zeros(self.numel, dtype=torch.float32)
            self.waiting = set(range(len(self.slots)))
        own = self._slice(self.grad, slot)
        grad = slot.param.grad
        if grad is not None and grad.data_ptr() != own.data_ptr():
            own.add_(grad.reshape(slot.shape))
            slot.param.grad = None
        self.waiting.discard(index)
        if not self.waiting:
            self.reduce()

    def reduce(self):
        self.engine.reduce_grads(self.id, self.grad.data_ptr(), self.numel)
        self.reductions += 1
        for slot in self.slots:
            slot.param.grad = None
        self.grad = None
        self.waiting = set()
        self.release()

    def flush(self, grad_accumulation):
        """Before a step: what arrived goes to the Engine; passes that did not reach the unit count
        as zero gradients."""
        if self.grad is not None:
            self.reduce()
        while self.reductions < grad_accumulation:
            self.grad = torch.zeros(self.numel, dtype=torch.float32)
            self.reduce()
        self.reductions = 0
        self.release()

    @staticmethod
    def _slice(flat, slot):
        return flat[slot.offset:slot.offset + slot.numel].view(slot.shape)


class _OpenGradients(torch.autograd.Function):
    """Identity; its backward runs when the gradient reaches the unit's output, just before the
    unit's own backward."""

    @staticmethod
    def forward(ctx, unit, tensor):
        ctx.unit = unit
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        ctx.unit.open_gradients()
        return None, grad


class _SavedSlice:
    __slots__ = ("unit", "offset", "size", "stride")

    def __init__(self, unit, offset, size, stride):
        self.unit, self.offset, self.size, self.stride = unit, offset, size, stride


class _NamedParams(list):
    """[(name, param)] with the module they belong to (None: the root unit)."""

    def __init__(self, items, module):
        super().__init__(items)
        self.module = module


def _unit_parameters(model, modules):
    """[(unit name, _NamedParams)]: one per listed module, then the root unit if any remain."""
    names = {id(module): name for name, module in model.named_modules()}
    for index, module in enumerate(modules):
        if id(module) not in names or module is model:
            raise ValueError(f"units[{index}] ({type(module).__name__}) is not a proper "
                             "submodule of the model")
    for a in modules:
        for b in modules:
            if a is not b and any(inner is b for inner in a.modules()):
                raise ValueError(f"units '{names[id(a)]}' and '{names[id(b)]}' nest: "
                                 "list disjoint submodules")
    owner = {}
    groups = []
    for module in modules:
        name = names[id(module)]
        items = []
        for param_name, param in module.named_parameters(prefix=name):
            if not param.requires_grad:
                continue
            if id(param) in owner:
                raise ValueError(f"parameter '{param_name}' is shared by units "
                                 f"'{owner[id(param)]}' and '{name}'")
            owner[id(param)] = name
            items.append((param_name, _checked(param_name, param)))
        if not items:
            raise ValueError(f"unit '{name}' has no trainable parameters")
        groups.append((name, _NamedParams(items, module)))
    rest = [(param_name, _checked(param_name, param))
            for param_name, param in model.named_parameters()
            if param.requires_grad and id(param) not in owner]
    if rest:
        groups.append(("root", _NamedParams(rest, None)))
    if not groups:
        raise ValueError("the model has no trainable parameters")
    return groups


def _checked(name, param):
    if param.device.type != "cpu" or param.dtype != torch.float32:
        raise ValueError(f"parameter '{name}' is {param.dtype} on {param.device}: wrap() takes "
                         "fp32 parameters on the CPU")
    return param


def _placeholder():
    return torch.empty(0, dtype=torch.float32)
