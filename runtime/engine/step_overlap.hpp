// How much of an offloaded optimizer step's two phases overlapped, from three measured times:
// t_io (the step with the arithmetic off: the I/O pipeline alone), t_adam (the arithmetic alone,
// in memory) and t_step (the real step). The ratio max(t_io, t_adam) / t_step alone hides a
// serial pipeline whenever one phase is small next to the other (1e9 parameters: 0.91 though
// nothing overlapped), so the figures report what is exposed and what is hidden:
//   exposed I/O   t_step - t_adam: the step's time beyond the arithmetic
//   exposed Adam  t_step - t_io:   the step's time beyond the I/O
//   hidden        (t_io + t_adam - t_step) / min(t_io, t_adam), within [0, 1]: the fraction of the
//                 smaller phase that ran under the larger one (1: fully overlapped, 0: serial)
#pragma once

#include <algorithm>

namespace strata::runtime {

struct StepOverlap {
  double exposed_io_s = 0;
  double exposed_adam_s = 0;
  double hidden_fraction = 0;  // of the smaller phase
  double ratio = 0;            // max(t_io, t_adam) / t_step
};

inline StepOverlap step_overlap(double t_io, double t_adam, double t_step) {
  StepOverlap overlap;
  overlap.exposed_io_s = std::max(0.0, t_step - t_adam);
  overlap.exposed_adam_s = std::max(0.0, t_step - t_io);
  const double smaller = std::min(t_io, t_adam);
  if (smaller > 0) {
    overlap.hidden_fraction = std::clamp((t_io + t_adam - t_step) / smaller, 0.0, 1.0);
  }
  if (t_step > 0) overlap.ratio = std::max(t_io, t_adam) / t_step;
  return overlap;
}

}  // namespace strata::runtime
