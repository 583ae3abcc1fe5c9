"""Proves strata.torch.wrap gives ZeRO-3 to a torch model: torch keeps no parameter values between
uses, training matches torch.optim.AdamW (with global-norm clipping) on host and NVMe placements
and any rank count, also with activation checkpointing, gradient accumulation sums micro-batches,
evaluation under no_grad sees the trained weights, checkpoints resume the run, and bad unit lists
are refused."""

import unittest

import torch

import strata
from strata.torch import wrap
from tiny_llama import TinyLlama, loss_of
from training import (assert_close_params, config, local_batch, scratch_dir, train_reference,
                      train_strata, batch)

STEPS = 4


def wrapped(placement, grad_accumulation=1, seed=0, scratch=None, resume=False,
            checkpointing=False):
    model = TinyLlama(seed=seed, checkpointing=checkpointing)
    zero = wrap(model, config(placement, scratch or scratch_dir(placement)),
                units=list(model.layers), grad_accumulation=grad_accumulation, resume=resume)
    return model, zero


class Zero3Test(unittest.TestCase):
    def check_matches_torch(self, placement):
        reference, reference_losses = train_reference(STEPS)
        model, zero = wrapped(placement)
        losses = train_strata(model, zero.optimizer, STEPS)
        assert_close_params(self, dict(reference.named_parameters()), zero.full_state_dict())
        if strata.world_size() == 1:
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses),
                                       atol=1e-5, rtol=1e-5)
        self.assertEqual(zero.optimizer.last_step["step"], STEPS)
        zero.close()

    def test_matches_torch_adamw_with_state_on_host(self):
        self.check_matches_torch("host")

    def test_matches_torch_adamw_with_everything_on_nvme(self):
        self.check_matches_torch("nvme")

    def test_activation_checkpointing_matches_torch(self):
        reference, _ = train_reference(3, model=TinyLlama(checkpointing=True))
        model, zero = wrapped("host", checkpointing=True)
        train_strata(model, zero.optimizer, 3)
        assert_close_params(self, dict(reference.named_parameters()), zero.full_state_dict())

    def test_torch_holds_no_parameter_values_between_uses(self):
        model, zero = wrapped("host")
        self.assertEqual([u.name for u in zero.units], ["layers.0", "layers.1", "root"])
        loss = loss_of(model, *local_batch(0))
        self.assertEqual(zero._gathered, set())  # every unit released after its forward
        loss.backward()
        for unit in zero.units:  # each unit's gradient went to strata during the backward
            self.assertEqual((unit.reductions, unit.grad, unit.flat), (1, None, None), unit.name)
        zero.optimizer.step()
        for name, param in model.named_parameters():
            self.assertEqual(param.numel(), 0, name)
            self.assertIsNone(param.grad, name)

    def test_gradient_accumulation_sums_micro_batches(self):
        reference, _ = train_reference(2)
        model, zero = wrapped("host", grad_accumulation=2)
        for step in range(2):
            tokens, targets = local_batch(step)
            half = tokens.shape[0] // 2
            for rows in (slice(0, half), slice(half, None)):
                (loss_of(model, tokens[rows], targets[rows]) / 2).backward()
            zero.optimizer.step()
        assert_close_params(self, dict(reference.named_parameters()), zero.full_state_dict())

    def test_evaluation_sees_the_trained_weights(self):
        reference, _ = train_reference(2)
        model, zero = wrapped("host")
        train_strata(model, zero.optimizer, 2)
        tokens, _ = batch(9)
        with torch.no_grad():
            torch.testing.assert_close(model(tokens), reference(tokens), atol=1e-4, rtol=1e-4)

    def test_checkpoint_resumes_the_run(self):
        straight_model, straight = wrapped("host")
        straight_losses = train_strata(straight_model, straight.optimizer, 4)
        model, zero = wrapped("host")
        train_strata(model, zero.optimizer, 2)
        directory = scratch_dir("zero3-checkpoint") + "/checkpoint"
        zero.save(directory)
        resumed_model, resumed = wrapped("host", seed=3)
        resumed.load(directory)
        self.assertEqual(train_strata(resumed_model, resumed.optimizer, 2, first_step=2),
                         straight_losses[2:])
        assert_close_params(self, straight.full_state_dict(), resumed.full_state_dict(),
                            atol=0, rtol=0)

    def test_resumes_from_the_nvme_store(self):
        scratch = scratch_dir("zero3-resume")
        model, zero = wrapped("nvme", scratch=scratch)
        train_strata(model, zero.optimizer, 2)
        expected = zero.full_state_dict()
        zero.close()
        resumed_model, resumed = wrapped("nvme", seed=3, scratch=scratch, resume=True)
        assert_close_params(self, expected, resumed.full_state_dict(), atol=0, rtol=0)
        self.assertEqual(resumed.engine.step_count, 2)

    def test_nested_units_are_refused(self):
        model = TinyLlama()
        with self.assertRaisesRegex(ValueError, "units 'layers.0' and 'layers.0.mlp' nest"):
            wrap(model, config("host", scratch_dir("nest")), units=[model.layers[0],
                                                                    model.layers[0].mlp])

    def test_a_module_outside_the_model_is_refused(self):
        model = TinyLlama()
        with self.assertRaisesRegex(ValueError, r"units\[0\] \(Linear\) is not a proper"):
            wrap(model, config("host", scratch_dir("outside")), units=[torch.nn.Linear(2, 2)])


if __name__ == "__main__":
    unittest.main()
