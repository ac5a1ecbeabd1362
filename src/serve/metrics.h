#pragma once
// The server's counters, gauges and histograms, rendered for `GET /metrics` in the Prometheus text
// exposition format (version 0.0.4). Contract: every method is thread safe (one mutex: a handful
// of updates per request and per decode step, far from contended); names start `gpt2_serve_`.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace gpt2::serve {

// Cumulative buckets with fixed upper bounds, as Prometheus histograms are.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // `name`_bucket{le=...}, `name`_sum, `name`_count lines.
  void render(std::string& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  explicit Metrics(int64_t max_batch);

  void request_answered(int status);  // every HTTP response, by status code
  void completion_done(int64_t prompt_tokens, int64_t completion_tokens, double seconds);
  void first_token(double seconds_since_arrival);    // time to first token
  void decode_step(int64_t active, double seconds);  // one batched decode iteration
  void prefill(int64_t tokens, double seconds);
  void set_queue(int64_t queued, int64_t active);
  void connection_opened();
  void connection_closed();
  void client_gone();  // a request cancelled by its client leaving

  std::string render() const;

 private:
  mutable std::mutex mu_;
  const int64_t max_batch_;
  std::map<int, uint64_t> responses_;
  uint64_t completions_ = 0, prompt_tokens_ = 0, completion_tokens_ = 0, decode_steps_ = 0, prefills_ = 0;
  uint64_t connections_total_ = 0, cancelled_ = 0;
  int64_t queued_ = 0, active_ = 0, open_connections_ = 0;
  Histogram ttft_, latency_, step_, occupancy_, prefill_;
};

}  // namespace gpt2::serve
