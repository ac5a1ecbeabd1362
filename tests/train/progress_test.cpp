// The ETA's speed (RecentRate) follows what the run does now: after a slow start it is the recent
// steps' speed, not the average since the start. Values are exact: each is a quotient of sums of
// small integers and of halves (exact in double).
#include <gtest/gtest.h>

#include <cmath>

#include "src/train/progress.h"

namespace gpt2 {
namespace {

TEST(RecentRate, UnknownUntilTwoLoggedSteps) {
  RecentRate rate;
  EXPECT_TRUE(std::isnan(rate.seconds_per_step()));
  rate.add(0, 10.0);
  EXPECT_TRUE(std::isnan(rate.seconds_per_step()));
  rate.add(10, 30.0);
  EXPECT_EQ(rate.seconds_per_step(), 2.0);
}

TEST(RecentRate, IsTheSpeedOfTheLastLoggedSteps) {
  RecentRate rate;
  double t = 0;
  for (int64_t step = 0; step <= 100; step += 10) {  // 2 s a step for 100 steps
    rate.add(step, t);
    t += 20.0;
  }
  t -= 20.0;
  for (int64_t step = 110; step <= 200; step += 10) {  // then 0.5 s a step
    t += 5.0;
    rate.add(step, t);
  }
  // The average since the start would be (200 + 50) / 200 = 1.25 s; the window holds only fast steps.
  EXPECT_EQ(rate.seconds_per_step(), 0.5);
  // One slow interval in the window counts with its weight: 7 intervals, 6 of 5 s and one of 40 s.
  t += 40.0;
  rate.add(210, t);
  EXPECT_EQ(rate.seconds_per_step(), (6 * 5.0 + 40.0) / 70.0);
}

}  // namespace
}  // namespace gpt2
