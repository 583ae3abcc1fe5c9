"""Proves a bad strata config reaches Python as an exception carrying strata's message and where
it points (file, line, key), whether the config is a TOML file or a dict, and that bad optimizer
overrides, unsupported settings and unsupported tensors (complex parameters, sparse gradients)
are refused by name."""

import os
import unittest

import torch

import strata
from strata.torch import OffloadOptimizer, wrap
from tiny_llama import TinyLlama
from training import BETAS, config, scratch_dir


class ConfigErrorTest(unittest.TestCase):
    def test_unknown_key_in_a_file_names_the_key_and_line(self):
        path = os.path.join(scratch_dir("config"), "bad.toml")
        with open(path, "w") as file:
            file.write("[optimizer]\nlr = 1e-3\nlearning_rate = 5\n")
        model = TinyLlama()
        with self.assertRaises(strata.ConfigError) as caught:
            OffloadOptimizer(model.parameters(), config=path)
        error = caught.exception
        self.assertIsInstance(error, ValueError)
        self.assertEqual((error.file, error.line, error.key), (path, 3, "optimizer.learning_rate"))
        self.assertIn(f"{path}:3:", str(error))
        self.assertIn("learning_rate", str(error))

    def test_wrong_type_in_a_dict_names_the_key(self):
        model = TinyLlama()
        with self.assertRaisesRegex(strata.ConfigError, r"<dict>:\d+:\d+: optimizer.lr: .*"):
            wrap(model, {"optimizer": {"lr": "fast"}}, units=list(model.layers))

    def test_inconsistent_combination_is_refused_by_strata(self):
        bad = config("nvme", scratch_dir("combo"))
        bad["tiers"]["nvme"]["paths"] = []
        with self.assertRaisesRegex(strata.ConfigError, "nvme"):
            OffloadOptimizer(TinyLlama().parameters(), config=bad)

    def test_cuda_device_is_refused(self):
        with self.assertRaisesRegex(ValueError, r'kind = "cuda": strata.torch runs the Engine'):
            OffloadOptimizer(TinyLlama().parameters(),
                             config={"tiers": {"device": {"kind": "cuda"}}})

    def test_bad_override_is_refused_by_name(self):
        with self.assertRaisesRegex(ValueError, r"invalid betas\[1\] 1.0"):
            OffloadOptimizer(TinyLlama().parameters(), betas=(0.9, 1.0))

    def test_group_values_that_are_not_numbers_are_refused_by_name(self):
        with self.assertRaisesRegex(ValueError, r"invalid betas 0\.9: must be two numbers"):
            OffloadOptimizer(TinyLlama().parameters(), betas=0.9)
        model = TinyLlama()
        with self.assertRaisesRegex(ValueError, r"param_groups\[1\]: .* betas two numbers"):
            OffloadOptimizer([{"params": model.head.parameters()},
                              {"params": model.embed.parameters(), "betas": (0.9,)}],
                             config=config("host", scratch_dir("betas")))
        optimizer = OffloadOptimizer(model.parameters(), config=config("host", scratch_dir("lr")))
        optimizer.param_groups[0]["lr"] = "fast"
        with self.assertRaisesRegex(ValueError, r"param_groups\[0\]: lr, eps and weight_decay "
                                                r"must be numbers"):
            optimizer.step()

    def test_complex_parameter_is_refused_by_name(self):
        params = [torch.nn.Parameter(torch.zeros(3)),
                  torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.complex64))]
        with self.assertRaisesRegex(ValueError, r"parameter group0\.param1 \(param_groups\[0\]"
                                                r"\['params'\]\[1\], shape \(2, 2\)\) is "
                                                r"torch\.complex64"):
            OffloadOptimizer(params, config=config("host", scratch_dir("complex")))

    def test_sparse_gradient_is_refused_by_name_before_any_is_handed_over(self):
        dense, embedding = torch.nn.Linear(4, 4), torch.nn.Embedding(10, 4, sparse=True)
        optimizer = OffloadOptimizer([{"params": dense.parameters()},
                                      {"params": embedding.parameters(), "weight_decay": 0.0}],
                                     config=config("host", scratch_dir("sparse")),
                                     grad_clip=0.0)
        dense(embedding(torch.tensor([1, 2]))).sum().backward()
        with self.assertRaisesRegex(ValueError, r"parameter group1\.param0 .* has a "
                                                r"torch\.sparse_coo gradient"):
            optimizer.step()
        embedding.weight.grad = None
        optimizer.step()  # dense's gradient reaches the Engine once, not once per step() call
        self.assertEqual(optimizer.last_step["step"], 1)
        torch.testing.assert_close(optimizer.state_shard(dense.weight, "exp_avg"),
                                   (1 - BETAS[0]) * dense.weight.grad.flatten())

    def test_unknown_state_kind_carries_strata_message(self):
        model = TinyLlama()
        optimizer = OffloadOptimizer(model.parameters(), config=config("host", scratch_dir("kind")))
        with self.assertRaisesRegex(ValueError, "unknown state kind 'momentum'"):
            optimizer.state_shard(model.head.weight, "momentum")

    def test_resume_without_a_store_carries_strata_message(self):
        with self.assertRaises(RuntimeError) as caught:
            OffloadOptimizer(TinyLlama().parameters(), config=config("nvme", scratch_dir("none")),
                             resume=True)
        self.assertIn("resume", str(caught.exception).lower())


if __name__ == "__main__":
    unittest.main()
