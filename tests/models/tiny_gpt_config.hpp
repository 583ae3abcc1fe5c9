// The tiny GPT the gradient and safetensors tests build: two layers of width 16, small enough for
// finite differences, with the output head tied to the embedding or not.
#pragma once

#include "runtime/config/config.hpp"

namespace strata::gpt::testing {

inline runtime::ModelConfig tiny_config(bool tied_head) {
  runtime::ModelConfig config;
  config.layers = 2;
  config.d_model = 16;
  config.heads = 2;
  config.seq_len = 8;
  config.vocab = 32;
  config.micro_batch = 2;
  config.tied_head = tied_head;
  return config;
}

}  // namespace strata::gpt::testing
