// Comparators shared by CPU and GPU tests: every element is checked, the worst one is reported.
#pragma once
#include <cstddef>
#include <span>
#include <string>

namespace m3::test {

struct CompareResult {
  bool ok = true;
  size_t n = 0;
  size_t worst_index = 0;   // element with the largest |got - ref| / (atol + rtol*|ref|)
  double worst_got = 0, worst_ref = 0;
  double max_abs_err = 0;   // max |got - ref|
  double max_abs_ref = 0;   // max |ref|
  double cosine = 1;        // cosine similarity over the whole tensor
  size_t nan_mismatch = 0;  // positions where exactly one side is NaN (or got is NaN)
  std::string describe() const;
};

// Element i passes when |got - ref| <= atol + rtol * |ref| and got is not NaN (unless ref is).
CompareResult compare(std::span<const float> got, std::span<const float> ref, double atol, double rtol);

}  // namespace m3::test

// gtest helper: EXPECT_CLOSE(got, ref, atol, rtol) prints the worst element on failure.
#define EXPECT_CLOSE(got, ref, atol, rtol)                                  \
  do {                                                                      \
    auto _r = ::m3::test::compare((got), (ref), (atol), (rtol));            \
    EXPECT_TRUE(_r.ok) << _r.describe();                                    \
  } while (0)
