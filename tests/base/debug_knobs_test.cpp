// Proves every debug knob follows its one rule: flags are 0/1 (unset or empty is 0), seeds are
// decimal numbers below 2^64, and any other value is a KnobError naming the variable and the value.
#include "base/debug_knobs.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>

namespace strata {
namespace {

// Sets (or, given nullopt, unsets) one variable for the scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = std::string(old);
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DebugKnobs, FlagsAreOffUnlessOne) {
  for (const char* name : {"STRATA_FORCE_NVME", "STRATA_POISON", "STRATA_POISON_BUFFERS"}) {
    {
      ScopedEnv unset(name, std::nullopt);
      EXPECT_FALSE(knobs::flag(name)) << name;
    }
    {
      ScopedEnv empty(name, "");
      EXPECT_FALSE(knobs::flag(name)) << name;
    }
    {
      ScopedEnv zero(name, "0");
      EXPECT_FALSE(knobs::flag(name)) << name;
    }
    ScopedEnv one(name, "1");
    EXPECT_TRUE(knobs::flag(name)) << name;
  }
  ScopedEnv nvme("STRATA_FORCE_NVME", "1");
  ScopedEnv poison("STRATA_POISON", "0");
  ScopedEnv buffers("STRATA_POISON_BUFFERS", "1");
  EXPECT_TRUE(force_nvme_knob());
  EXPECT_FALSE(poison_device_knob());
  EXPECT_TRUE(poison_io_buffers_knob());
}

TEST(DebugKnobs, AnyOtherFlagValueIsAnErrorNamingTheKnob) {
  for (const char* value : {"yes", "true", "2", "10", " 1", "on"}) {
    ScopedEnv bad("STRATA_POISON", value);
    try {
      poison_device_knob();
      FAIL() << "accepted STRATA_POISON=" << value;
    } catch (const KnobError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find(std::string("STRATA_POISON=\"") + value + "\""), std::string::npos)
          << what;
      EXPECT_NE(what.find("0 or 1"), std::string::npos) << what;
    }
  }
}

TEST(DebugKnobs, SeedsAreDecimalAndOptional) {
  {
    ScopedEnv unset("STRATA_TEST_SEED", std::nullopt);
    EXPECT_EQ(test_seed_knob(), std::nullopt);
  }
  {
    ScopedEnv empty("STRATA_CRASH_SEED", "");
    EXPECT_EQ(crash_seed_knob(), std::nullopt);
  }
  {
    ScopedEnv seed("STRATA_TEST_SEED", "20261129");
    EXPECT_EQ(test_seed_knob(), 20261129u);
  }
  ScopedEnv largest("STRATA_CRASH_SEED", "18446744073709551615");
  EXPECT_EQ(crash_seed_knob(), 18446744073709551615ull);
}

TEST(DebugKnobs, MalformedSeedIsAnErrorNamingTheKnob) {
  for (const char* value : {"0x10", "-1", "12abc", "1e5", "18446744073709551616"}) {
    ScopedEnv bad("STRATA_CRASH_SEED", value);
    try {
      crash_seed_knob();
      FAIL() << "accepted STRATA_CRASH_SEED=" << value;
    } catch (const KnobError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("STRATA_CRASH_SEED"), std::string::npos) << what;
      EXPECT_NE(what.find("decimal number"), std::string::npos) << what;
    }
  }
}

TEST(DebugKnobs, TestTmpdirDefaultsToTmp) {
  {
    ScopedEnv unset("STRATA_TEST_TMPDIR", std::nullopt);
    EXPECT_EQ(test_tmpdir_knob(), std::filesystem::path("/tmp"));
  }
  {
    ScopedEnv empty("STRATA_TEST_TMPDIR", "");
    EXPECT_EQ(test_tmpdir_knob(), std::filesystem::path("/tmp"));
  }
  ScopedEnv set("STRATA_TEST_TMPDIR", "/work/scratch");
  EXPECT_EQ(test_tmpdir_knob(), std::filesystem::path("/work/scratch"));
}

}  // namespace
}  // namespace strata
