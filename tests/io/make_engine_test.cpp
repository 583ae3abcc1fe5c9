// Proves engine selection: `auto` falls back to POSIX with one warning line when the kernel refuses
// io_uring, `io_uring` fails with a clear error instead, and the kinds parse from their names.
#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "io/fault_injector.hpp"
#include "io/make_engine.hpp"
#include "io_test_support.hpp"

namespace strata::io {
namespace {

TEST(MakeEngineTest, ParsesKinds) {
  EXPECT_EQ(parse_io_engine_kind("auto"), IoEngineKind::kAuto);
  EXPECT_EQ(parse_io_engine_kind("io_uring"), IoEngineKind::kIoUring);
  EXPECT_EQ(parse_io_engine_kind("posix"), IoEngineKind::kPosix);
  EXPECT_EQ(parse_io_engine_kind("uring"), std::nullopt);
  EXPECT_EQ(to_string(IoEngineKind::kIoUring), "io_uring");
}

TEST(MakeEngineTest, PosixKindIsPosix) {
  IoEngineOptions options;
  options.kind = IoEngineKind::kPosix;
  EXPECT_EQ(make_io_engine(options)->name(), "posix");
}

TEST(MakeEngineTest, AutoUsesIoUringWhenTheKernelAllows) {
  IoEngineOptions options;
  options.kind = IoEngineKind::kAuto;
  try {
    UringEngine probe(options);
  } catch (const UringUnavailable& refused) {
    GTEST_SKIP() << "io_uring refused by this kernel: " << refused.what();
  }
  ::testing::internal::CaptureStderr();
  const std::string name(make_io_engine(options)->name());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(name, "io_uring");
}

TEST(MakeEngineTest, AutoFallsBackToPosixWithOneWarningLine) {
  for (int refusal : {ENOSYS, EPERM}) {
    FaultInjector faults;
    faults.fail_ring_setup(refusal);
    IoEngineOptions options;
    options.kind = IoEngineKind::kAuto;
    options.faults = &faults;
    ::testing::internal::CaptureStderr();
    std::unique_ptr<IoEngine> engine = make_io_engine(options);
    const std::string warning = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(engine->name(), "posix");
    EXPECT_NE(warning.find("warning"), std::string::npos) << warning;
    EXPECT_NE(warning.find("POSIX"), std::string::npos) << warning;
    EXPECT_EQ(std::count(warning.begin(), warning.end(), '\n'), 1) << warning;
  }
}

TEST(MakeEngineTest, IoUringKindFailsClearlyWhenRefused) {
  FaultInjector faults;
  faults.fail_ring_setup(EPERM);
  IoEngineOptions options;
  options.kind = IoEngineKind::kIoUring;
  options.faults = &faults;
  try {
    make_io_engine(options);
    FAIL() << "expected UringUnavailable";
  } catch (const UringUnavailable& refused) {
    const std::string what = refused.what();
    EXPECT_EQ(refused.code().value(), EPERM);
    EXPECT_NE(what.find("io_uring"), std::string::npos) << what;
    EXPECT_NE(what.find("Operation not permitted"), std::string::npos) << what;
    EXPECT_NE(what.find("posix"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace strata::io
