// STRATA_ASSERT: checks for programmer errors (broken invariants), never for user input.
// It stays on in every build that defines STRATA_ENABLE_ASSERTS (the default, and all test builds):
// a violated invariant in a storage runtime must stop the process before it writes wrong bytes.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace strata::detail {

[[noreturn]] inline void assert_failed(const char* expression, const char* file, int line,
                                       const char* message) noexcept {
  std::fprintf(stderr, "strata: assertion failed: %s (%s:%d)%s%s\n", expression, file, line,
               message[0] != '\0' ? ": " : "", message);
  std::fflush(stderr);
  std::abort();
}

}  // namespace strata::detail

#if defined(STRATA_ENABLE_ASSERTS)
#define STRATA_ASSERT(expression, ...) \
  ((expression)                        \
       ? static_cast<void>(0)          \
       : ::strata::detail::assert_failed(#expression, __FILE__, __LINE__, "" __VA_ARGS__))
#else
#define STRATA_ASSERT(expression, ...) static_cast<void>(sizeof(expression))
#endif
