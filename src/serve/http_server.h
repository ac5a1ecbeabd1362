#pragma once
// gpt2-serve's HTTP/1.1 front (Boost.Beast over Boost.Asio): keep-alive connections served by a
// few I/O threads, OpenAI-compatible `POST /v1/completions` (JSON or server-sent events),
// `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text). Completions go to the
// Scheduler; its events come back to the connection's strand, so no I/O thread ever waits for
// the model.
// Contract: every error path answers (4xx/5xx with an OpenAI-style JSON error naming the field)
// or drops the connection, and the server goes on: bodies over max_body_bytes get 413, headers
// over 16 KiB 431, a request not read in full within read_timeout_s (slow or half-open clients,
// idle keep-alive) is dropped, a response a client does not read within write_timeout_s is
// dropped, a client that leaves cancels its sequences (their slots free at the next iteration),
// connections past max_connections get 503 and are closed.
// With an API key, every request lacking `Authorization: Bearer <key>` gets 401. run() returns
// after SIGTERM/SIGINT: stop accepting, answer what is in flight (up to shutdown_timeout_s,
// then cancel it), close.
#include <cstdint>
#include <memory>
#include <string>

namespace gpt2::data {
class Gpt2Tokenizer;
}

namespace gpt2::serve {

class Metrics;
class Scheduler;
struct CompletionLimits;

struct ServerOptions {
  std::string host = "127.0.0.1";    // loopback unless asked: the server has no TLS
  uint16_t port = 8000;              // 0 = any free port (run() logs the one bound)
  std::string api_key;               // empty = no authentication
  int64_t max_body_bytes = 1 << 20;  // 413 above this
  double read_timeout_s = 30;        // a whole request (headers and body), and keep-alive idling
  double write_timeout_s = 30;       // each write of a response or stream chunk
  double shutdown_timeout_s = 30;    // SIGTERM: how long requests in flight may go on
  int io_threads = 2;
  int64_t max_connections = 1000;  // more are answered 503 and closed at once (descriptors are finite)
};

class Server {
 public:
  Server(ServerOptions options, Scheduler& scheduler, const data::Gpt2Tokenizer& tokenizer,
         const CompletionLimits& limits, Metrics& metrics);
  ~Server();
  // Binds and listens; gpt2::UserError naming --host/--port when that fails. Returns the port.
  uint16_t listen();
  // Serves until SIGTERM/SIGINT (then drains as above). Call listen() first.
  void run();

  struct Impl;  // in http_server.cpp (named here so its connections can reach it)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpt2::serve
