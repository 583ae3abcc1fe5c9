"""Proves strata.torch.OffloadOptimizer trains a Llama-style model like torch.optim.AdamW (with
global-norm clipping) on host and NVMe placements and any rank count, keeps torch's param-group
(each group's own lr, betas, eps and weight decay), LR-scheduler and state_dict interfaces, writes
parameters back in their dtype, and resumes from the NVMe store."""

import unittest

import torch

import strata
from strata.torch import OffloadOptimizer
from tiny_llama import TinyLlama, loss_of
from training import (BETAS, EPS, LR, WEIGHT_DECAY, assert_close_params, batch, config,
                      scratch_dir, train_reference, train_strata)

STEPS = 5


def no_decay_groups(model):
    """torch practice: matrices decay; norms, biases and embeddings do not."""
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    return [{"params": decay}, {"params": rest, "weight_decay": 0.0}]


def distinct_groups(model):
    """Two groups that differ in every hyper-parameter torch's AdamW has."""
    return [{"params": model.layers.parameters(), "lr": 5e-3, "weight_decay": 0.2,
             "betas": (0.8, 0.99), "eps": 1e-6},
            {"params": list(model.embed.parameters()) + list(model.norm.parameters()) +
             list(model.head.parameters()), "weight_decay": 0.0}]


class OffloadOptimizerTest(unittest.TestCase):
    def run_strata(self, placement, steps=STEPS, groups=None, schedule=None, **overrides):
        model = TinyLlama()
        optimizer = OffloadOptimizer(groups(model) if groups else model.parameters(),
                                     config=config(placement, scratch_dir(placement)),
                                     **overrides)
        scheduler = schedule(optimizer) if schedule else None
        losses = train_strata(model, optimizer, steps, schedule=scheduler)
        return model, optimizer, losses

    def check_matches_torch(self, placement):
        reference, reference_losses = train_reference(STEPS)
        model, optimizer, losses = self.run_strata(placement)
        assert_close_params(self, dict(reference.named_parameters()),
                            dict(model.named_parameters()))
        if strata.world_size() == 1:  # otherwise each rank's loss is of its own rows
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses),
                                       atol=1e-5, rtol=1e-5)
        self.assertLess(reference_losses[-1], 0.9 * reference_losses[0])
        self.assertEqual(optimizer.last_step["step"], STEPS)
        self.assertAlmostEqual(optimizer.last_step["lr"], LR)
        self.assertGreater(optimizer.last_step["hand_over_s"], 0)
        self.assertGreater(optimizer.last_step["write_back_s"], 0)
        optimizer.close()

    def test_matches_torch_adamw_with_state_on_host(self):
        self.check_matches_torch("host")

    def test_matches_torch_adamw_with_state_on_nvme(self):
        self.check_matches_torch("nvme")

    def test_moments_match_torch(self):
        if strata.world_size() > 1:
            self.skipTest("each rank holds a shard of the moments")
        reference = TinyLlama()
        torch_optimizer = torch.optim.AdamW(reference.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                            weight_decay=WEIGHT_DECAY)
        model, optimizer, _ = self.run_strata("host", steps=1, grad_clip=0.0)
        loss_of(reference, *batch(0)).backward()
        torch_optimizer.step()
        for (name, param), torch_param in zip(model.named_parameters(), reference.parameters()):
            state = torch_optimizer.state[torch_param]
            for kind in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(optimizer.state_shard(param, kind),
                                           state[kind].flatten(), atol=1e-7, rtol=1e-5,
                                           msg=lambda m: f"{name} {kind}: {m}")

    def test_param_groups_turn_weight_decay_off_per_group(self):
        reference, _ = train_reference(STEPS, param_groups=no_decay_groups)
        model, optimizer, _ = self.run_strata("host", groups=no_decay_groups)
        assert_close_params(self, dict(reference.named_parameters()),
                            dict(model.named_parameters()))
        decayed, _ = train_reference(STEPS)
        self.assertFalse(torch.allclose(decayed.norm.weight, model.norm.weight, atol=1e-6))

    def test_frozen_parameters_are_left_alone(self):
        def frozen_embedding(model):
            model.embed.weight.requires_grad_(False)
            return model.parameters()
        reference, _ = train_reference(STEPS, param_groups=frozen_embedding)
        model, _, _ = self.run_strata("host", groups=frozen_embedding)
        assert_close_params(self, dict(reference.named_parameters()),
                            dict(model.named_parameters()))
        self.assertTrue(torch.equal(model.embed.weight, TinyLlama().embed.weight))

    def test_lr_scheduler_sets_the_learning_rate(self):
        halving = lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.5)
        reference, _ = train_reference(STEPS, schedule=halving)
        model, optimizer, _ = self.run_strata("host", schedule=halving)
        assert_close_params(self, dict(reference.named_parameters()),
                            dict(model.named_parameters()))
        self.assertAlmostEqual(optimizer.last_step["lr"], LR / 4)

    def test_two_groups_of_own_lr_decay_and_betas_matches_torch_adamw(self):
        reference, _ = train_reference(STEPS, param_groups=distinct_groups)
        for placement in ("host", "nvme"):
            model, optimizer, _ = self.run_strata(placement, groups=distinct_groups)
            assert_close_params(self, dict(reference.named_parameters()),
                                dict(model.named_parameters()))
            optimizer.close()
        # The groups' values matter: one shared set of values trains other weights.
        uniform, _ = train_reference(STEPS)
        self.assertFalse(torch.allclose(uniform.head.weight, model.head.weight, atol=1e-4))

    def test_per_group_lambda_lr_scheduler_matches_torch(self):
        per_group = lambda optimizer: torch.optim.lr_scheduler.LambdaLR(
            optimizer, [lambda step: 0.5 ** step, lambda step: 1.0 + step])
        reference, _ = train_reference(STEPS, param_groups=distinct_groups, schedule=per_group)
        model, optimizer, _ = self.run_strata("host", groups=distinct_groups, schedule=per_group)
        assert_close_params(self, dict(reference.named_parameters()),
                            dict(model.named_parameters()))
        self.assertAlmostEqual(optimizer.last_step["lr"], 5e-3 * 0.5 ** (STEPS - 1))

    def test_group_values_changed_between_steps_are_handed_over(self):
        def change(optimizer):  # a "scheduler" that edits weight decay and betas at step 2
            class Edit:
                steps = 0

                def step(self):
                    Edit.steps += 1
                    if Edit.steps == 2:
                        optimizer.param_groups[1]["weight_decay"] = 0.3
                        optimizer.param_groups[0]["betas"] = (0.7, 0.9)
            return Edit()
        reference, _ = train_reference(STEPS, param_groups=distinct_groups, schedule=change)
        model, _, _ = self.run_strata("host", groups=distinct_groups, schedule=change)
        assert_close_params(self, dict(reference.named_parameters()),
                            dict(model.named_parameters()))

    def test_a_bad_group_value_is_refused_naming_the_unit(self):
        model = TinyLlama()
        optimizer = OffloadOptimizer(distinct_groups(model),
                                     config=config("host", scratch_dir("bad")))
        optimizer.param_groups[1]["lr"] = float("nan")
        with self.assertRaisesRegex(ValueError, r"unit 'group1\.param0': lr = nan"):
            train_strata(model, optimizer, 1)

    def test_fp32_cpu_gradients_are_handed_over_without_a_copy(self):
        model = TinyLlama()
        optimizer = OffloadOptimizer(model.parameters(), config=config("host", scratch_dir("nc")))
        optimizer._staging.fill_(float("nan"))  # any copy through it would show
        train_strata(model, optimizer, 2)
        self.assertTrue(optimizer._staging.isnan().all())
        self.assertTrue(all(param.isfinite().all() for param in model.parameters()))

    def test_bf16_parameters_receive_the_rounded_master(self):
        model = TinyLlama().to(torch.bfloat16)
        optimizer = OffloadOptimizer(model.parameters(), config=config("host", scratch_dir("bf")))
        train_strata(model, optimizer, 2)
        for param in model.parameters():
            self.assertEqual(param.dtype, torch.bfloat16)
            master = optimizer.state_shard(param, "master")
            if strata.world_size() == 1:
                self.assertTrue(torch.equal(param.flatten(), master.to(torch.bfloat16)))

    def test_state_dict_round_trip_continues_the_run(self):
        _, _, straight = self.run_strata("host", steps=4)
        first, optimizer, _ = self.run_strata("host", steps=2)
        saved = optimizer.state_dict()
        self.assertEqual(saved["strata"]["step"], 2)
        files = saved["strata"]["files"]  # the state's bytes exist once, on rank 0
        if strata.rank() == 0:
            self.assertIn("manifest.json", files)
        else:
            self.assertIsNone(files)
        model = TinyLlama(seed=99)
        restored = OffloadOptimizer(model.parameters(), config=config("host", scratch_dir("sd")))
        restored.load_state_dict(saved)
        assert_close_params(self, dict(first.named_parameters()), dict(model.named_parameters()),
                            atol=0, rtol=0)
        continued = train_strata(model, restored, 2, first_step=2)
        self.assertEqual(continued, straight[2:])

    def test_state_dict_restores_per_group_values(self):
        _, _, straight = self.run_strata("host", steps=4, groups=distinct_groups)
        first, optimizer, _ = self.run_strata("host", steps=2, groups=distinct_groups)
        saved = optimizer.state_dict()
        model = TinyLlama(seed=99)
        same_shape = lambda m: [{"params": g["params"]} for g in distinct_groups(m)]
        restored = OffloadOptimizer(same_shape(model), config=config("host", scratch_dir("sdg")))
        restored.load_state_dict(saved)  # the groups' lr, betas, eps and decay come back too
        self.assertEqual(restored.param_groups[0]["lr"], 5e-3)
        continued = train_strata(model, restored, 2, first_step=2)
        self.assertEqual(continued, straight[2:])

    def test_load_state_dict_without_rank0_files_is_refused_on_every_rank(self):
        model = TinyLlama()
        optimizer = OffloadOptimizer(model.parameters(), config=config("host", scratch_dir("nf")))
        saved = optimizer.state_dict()
        saved["strata"]["files"] = None  # what the other ranks' state_dict() holds
        with self.assertRaisesRegex(ValueError, "carries no checkpoint files: pass rank 0's"):
            optimizer.load_state_dict(saved)

    def test_load_state_dict_refuses_a_torch_state(self):
        model = TinyLlama()
        optimizer = OffloadOptimizer(model.parameters(), config=config("host", scratch_dir("ts")))
        torch_state = torch.optim.AdamW(model.parameters()).state_dict()
        with self.assertRaisesRegex(ValueError, "no 'strata' entry"):
            optimizer.load_state_dict(torch_state)

    def test_resumes_from_the_nvme_store_with_param_groups(self):
        scratch = scratch_dir("resume-groups")
        straight_model = TinyLlama()
        straight = OffloadOptimizer(distinct_groups(straight_model),
                                    config=config("nvme", scratch_dir("straight-groups")))
        straight_losses = train_strata(straight_model, straight, 4)
        straight.close()

        model = TinyLlama()
        optimizer = OffloadOptimizer(distinct_groups(model), config=config("nvme", scratch))
        train_strata(model, optimizer, 2)
        optimizer.close()
        del optimizer

        resumed_model = TinyLlama(seed=5)
        resumed = OffloadOptimizer(distinct_groups(resumed_model),
                                   config=config("nvme", scratch), resume=True)
        self.assertEqual(train_strata(resumed_model, resumed, 2, first_step=2),
                         straight_losses[2:])
        assert_close_params(self, dict(straight_model.named_parameters()),
                            dict(resumed_model.named_parameters()), atol=0, rtol=0)

    def test_resumes_from_the_nvme_store(self):
        scratch = scratch_dir("resume")
        straight_model = TinyLlama()
        straight = OffloadOptimizer(straight_model.parameters(),
                                    config=config("nvme", scratch_dir("straight")))
        straight_losses = train_strata(straight_model, straight, 5)

        model = TinyLlama()
        optimizer = OffloadOptimizer(model.parameters(), config=config("nvme", scratch))
        train_strata(model, optimizer, 3)
        optimizer.close()
        del optimizer

        resumed_model = TinyLlama(seed=5)  # other weights: the store's must replace them
        resumed = OffloadOptimizer(resumed_model.parameters(), config=config("nvme", scratch),
                                   resume=True)
        assert_close_params(self, dict(model.named_parameters()),
                            dict(resumed_model.named_parameters()), atol=0, rtol=0)
        self.assertEqual(train_strata(resumed_model, resumed, 2, first_step=3), straight_losses[3:])
        assert_close_params(self, dict(straight_model.named_parameters()),
                            dict(resumed_model.named_parameters()), atol=0, rtol=0)


if __name__ == "__main__":
    unittest.main()
