// native/env_switch.h: the environment switches of side-by-side measurements (M3_FUSED_NORMS,
// M3_SPLIT_ACT: on unless 0, with a test override; M3_ROPE_LAST, M3_COMBINE_LAST: off unless set; M3_MMA_WALK, M3_MOE_WALK: one of named values).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/check.h"
#include "native/env_switch.h"

using namespace m3;

TEST(EnvSwitch, OnUnlessZeroAndTheOverrideWins) {
  const char* var = "M3_TEST_ENV_SWITCH";
  ::unsetenv(var);
  {
    native::EnvSwitch s(var);
    EXPECT_TRUE(s.on());
    s.set(0);
    EXPECT_FALSE(s.on());
    s.set(1);
    EXPECT_TRUE(s.on());
  }
  ::setenv(var, "0", 1);
  {
    native::EnvSwitch s(var);
    EXPECT_FALSE(s.on());
    s.set(1);
    EXPECT_TRUE(s.on());
    s.set(-1);
    EXPECT_FALSE(s.on());  // back to the environment's
  }
  ::setenv(var, "1", 1);
  EXPECT_TRUE(native::EnvSwitch(var).on());
  ::unsetenv(var);
}

// A switch off by default (M3_ROPE_LAST, M3_COMBINE_LAST): off unset or empty, on at any value but 0.
TEST(EnvSwitch, OffByDefaultUnlessSet) {
  const char* var = "M3_TEST_ENV_SWITCH_OFF";
  ::unsetenv(var);
  {
    native::EnvSwitch s(var, false);
    EXPECT_FALSE(s.on());
    s.set(1);
    EXPECT_TRUE(s.on());
    s.set(-1);
    EXPECT_FALSE(s.on());
  }
  ::setenv(var, "", 1);
  EXPECT_FALSE(native::EnvSwitch(var, false).on());
  EXPECT_TRUE(native::EnvSwitch(var).on());
  ::setenv(var, "1", 1);
  EXPECT_TRUE(native::EnvSwitch(var, false).on());
  ::setenv(var, "0", 1);
  EXPECT_FALSE(native::EnvSwitch(var, false).on());
  ::unsetenv(var);
}

TEST(EnvSwitch, ChoiceIsTheValuesIndexAndNamesABadValue) {
  const char* var = "M3_TEST_ENV_CHOICE";
  ::unsetenv(var);
  EXPECT_EQ(native::env_choice(var, {"2x2", "3x1", "4x1"}, "4x1"), 2);  // unset: the default's
  ::setenv(var, "3x1", 1);
  EXPECT_EQ(native::env_choice(var, {"2x2", "3x1", "4x1"}, "4x1"), 1);
  ::setenv(var, "5x1", 1);
  try {
    native::env_choice(var, {"2x2", "3x1", "4x1"}, "4x1");
    ADD_FAILURE() << "5x1 was accepted";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("M3_TEST_ENV_CHOICE=5x1"), std::string::npos) << w;
    EXPECT_NE(w.find("2x2, 3x1, 4x1"), std::string::npos) << w;
  }
  ::unsetenv(var);
}
