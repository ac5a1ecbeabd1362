// Prometheus text format for the server's metrics (see metrics.h).
#include "src/serve/metrics.h"

#include <cstdio>

namespace gpt2::serve {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const char* type, const char* help, double value) {
  header(out, name, type, help);
  out += name + " " + number(value) + "\n";
}

// Seconds: 1 ms to 2 minutes.
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + number(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics(int64_t max_batch)
    : max_batch_(max_batch),
      ttft_(latency_bounds()),
      latency_(latency_bounds()),
      step_({0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1}),
      occupancy_({0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1}),
      prefill_(latency_bounds()) {}

void Metrics::request_answered(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++responses_[status];
}

void Metrics::completion_done(int64_t prompt_tokens, int64_t completion_tokens, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++completions_;
  prompt_tokens_ += prompt_tokens;
  completion_tokens_ += completion_tokens;
  latency_.observe(seconds);
}

void Metrics::first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::decode_step(int64_t active, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++decode_steps_;
  step_.observe(seconds);
  occupancy_.observe(static_cast<double>(active) / static_cast<double>(max_batch_));
}

void Metrics::prefill(int64_t tokens, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++prefills_;
  prefill_.observe(seconds);
  (void)tokens;
}

void Metrics::set_queue(int64_t queued, int64_t active) {
  std::lock_guard<std::mutex> lock(mu_);
  queued_ = queued;
  active_ = active;
}

void Metrics::connection_opened() {
  std::lock_guard<std::mutex> lock(mu_);
  ++open_connections_;
  ++connections_total_;
}

void Metrics::connection_closed() {
  std::lock_guard<std::mutex> lock(mu_);
  --open_connections_;
}

void Metrics::client_gone() {
  std::lock_guard<std::mutex> lock(mu_);
  ++cancelled_;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  header(out, "gpt2_serve_http_responses_total", "counter", "HTTP responses sent, by status code.");
  for (const auto& [code, n] : responses_) {
    out += "gpt2_serve_http_responses_total{code=\"" + std::to_string(code) + "\"} " + std::to_string(n) + "\n";
  }
  sample(out, "gpt2_serve_completions_total", "counter", "Completion requests answered in full.", completions_);
  sample(out, "gpt2_serve_prompt_tokens_total", "counter", "Prompt tokens of answered completions.", prompt_tokens_);
  sample(out, "gpt2_serve_generation_tokens_total", "counter", "Tokens generated for answered completions.",
         completion_tokens_);
  sample(out, "gpt2_serve_cancelled_total", "counter", "Requests cancelled because the client went away.", cancelled_);
  sample(out, "gpt2_serve_queue_depth", "gauge", "Sequences waiting for a batch slot.", queued_);
  sample(out, "gpt2_serve_active_sequences", "gauge", "Sequences holding a batch slot.", active_);
  sample(out, "gpt2_serve_max_batch", "gauge", "Batch slots (--max_batch).", max_batch_);
  sample(out, "gpt2_serve_open_connections", "gauge", "Open HTTP connections.", open_connections_);
  sample(out, "gpt2_serve_connections_total", "counter", "HTTP connections accepted.", connections_total_);
  sample(out, "gpt2_serve_decode_steps_total", "counter", "Batched decode iterations.", decode_steps_);
  sample(out, "gpt2_serve_prefills_total", "counter", "Prompt prefills.", prefills_);
  header(out, "gpt2_serve_time_to_first_token_seconds", "histogram", "From request arrival to its first token.");
  ttft_.render(out, "gpt2_serve_time_to_first_token_seconds");
  header(out, "gpt2_serve_request_duration_seconds", "histogram", "From arrival to the last token of a completion.");
  latency_.render(out, "gpt2_serve_request_duration_seconds");
  header(out, "gpt2_serve_decode_step_seconds", "histogram", "One batched decode iteration.");
  step_.render(out, "gpt2_serve_decode_step_seconds");
  header(out, "gpt2_serve_prefill_seconds", "histogram", "One prompt's prefill.");
  prefill_.render(out, "gpt2_serve_prefill_seconds");
  header(out, "gpt2_serve_batch_occupancy", "histogram", "Active slots / max_batch per decode iteration.");
  occupancy_.render(out, "gpt2_serve_batch_occupancy");
  return out;
}

}  // namespace gpt2::serve
