#pragma once
// CUDA graphs of one step of device work, one graph per integer key (the shape the work takes:
// the decode step's `attend`, a prefill's padded length), captured the first time a key comes,
// all in one private memory pool (Note [Decode graphs] in decode_graphs.cpp says what makes a step
// capturable and why one pool serves every graph).
// Contract: one thread at a time calls replay(). `work(key)` runs the device work on the current
// stream from static inputs and ends by copying its results into static outputs the caller owns;
// it must not sync, read device values on the host or allocate pinned memory. A failed capture
// logs one warning naming `what` and the reason and turns the graphs off for good: replay() then
// returns false and the caller runs `work` eagerly; no capture error leaves replay(). Without a
// CUDA device (or a CUDA build), or with use_graphs false, the graphs are off from the start.
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace gpt2::serve {

class StepGraphs {
 public:
  // For the log: `what` the work ("decode step"), `name_key` a key in words ("padded length 64").
  StepGraphs(torch::Device device, bool use_graphs, std::string what, std::function<std::string(int64_t)> name_key);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Replays the graph of `key` on the current stream, capturing work(key) first when the key is
  // new (two eager warm-up runs on a side stream, then the capture: the inputs must already be in
  // place, and the warm-ups' writes must be the ones a replay makes). false: graphs are off (or
  // this capture failed); nothing was replayed.
  bool replay(int64_t key, const std::function<void(int64_t)>& work);

  bool on() const { return on_; }
  int64_t captured() const;  // graphs held (0 when off)

 private:
  struct Graphs;  // the CUDA part: the pool and the graph of each key
  torch::Device device_;
  std::string what_;
  std::function<std::string(int64_t)> name_key_;
  bool on_ = false;
  std::unique_ptr<Graphs> graphs_;
};

}  // namespace gpt2::serve
