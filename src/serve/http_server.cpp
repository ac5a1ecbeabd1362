// gpt2-serve's HTTP front over Boost.Beast (see http_server.h).
#include "src/serve/http_server.h"

#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <ctime>
#include <deque>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "src/base/errors.h"
#include "src/base/json.h"
#include "src/base/log.h"
#include "src/base/threads.h"
#include "src/serve/completion_request.h"
#include "src/serve/metrics.h"
#include "src/serve/scheduler.h"

namespace gpt2::serve {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Response = http::response<http::string_body>;

constexpr uint32_t kHeaderLimit = 16 * 1024;
constexpr double kLingerSeconds = 2;  // reading (and dropping) the rest of a refused body before closing

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// Compares without an early exit, so response times do not reveal how much of a key was right.
bool same_secret(std::string_view given, std::string_view expected) {
  unsigned diff = given.size() != expected.size() ? 1 : 0;
  for (size_t i = 0; i < given.size() && i < expected.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
  return diff == 0;
}

// `Authorization: Bearer <key>`: the scheme is case-insensitive and followed by one or more
// spaces (RFC 7235 section 2.1); the key is compared in constant time.
bool authorized(std::string_view header, const std::string& key) {
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(header[i])) != kScheme[i]) return false;
  }
  size_t at = kScheme.size();
  if (header[at] != ' ') return false;
  while (at < header.size() && header[at] == ' ') ++at;
  return same_secret(header.substr(at), key);
}

std::string error_body(int status, const std::string& param, const std::string& message) {
  json::Value e = {{"message", message},
                   {"type", status >= 500   ? "server_error"
                            : status == 401 ? "authentication_error"
                                            : "invalid_request_error"},
                   {"param", param.empty() ? json::Value() : json::Value(param)},
                   {"code", json::Value()}};
  return json::dump(json::Value{{"error", e}}) + "\n";
}

// One HTTP/1.1 chunk.
std::string chunk(const std::string& payload) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", payload.size());
  return size + payload + "\r\n";
}

}  // namespace

struct Server::Impl {
  Impl(ServerOptions o, Scheduler& s, const data::Gpt2Tokenizer& t, const CompletionLimits& l, Metrics& m)
      : options(std::move(o)), scheduler(s), tokenizer(t), limits(l), metrics(m) {}

  void accept();
  void on_signal();
  void poll_drain();

  // What connections use comes first: members are destroyed in reverse order, and connections
  // still held by pending handlers are destroyed with ioc.
  ServerOptions options;
  Scheduler& scheduler;
  const data::Gpt2Tokenizer& tokenizer;
  CompletionLimits limits;
  Metrics& metrics;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> in_flight{0};  // completions accepted and not yet answered in full
  std::atomic<int64_t> connections{0};
  std::atomic<uint64_t> next_id{0};
  std::mutex seeds_mu;
  std::mt19937_64 seeds{std::random_device{}()};         // seeds for requests that give none (under seeds_mu)
  std::chrono::steady_clock::time_point drain_deadline;  // control strand
  bool cancelled_all = false;                            // control strand

  net::io_context ioc;
  net::strand<net::io_context::executor_type> control{net::make_strand(ioc)};  // acceptor, signals, drain
  tcp::acceptor acceptor{control};
  net::steady_timer timer{control};
  net::signal_set signals{control, SIGINT, SIGTERM};
};

namespace {

// One connection: reads a request, answers it, reads the next (keep-alive), all on its strand.
// At most one completion is in flight per connection (no pipelining of completions).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Server::Impl& server) : stream_(std::move(socket)), server_(server) {
    ++server_.connections;
    server_.metrics.connection_opened();
  }
  ~Session() {
    release_completion();
    --server_.connections;
    server_.metrics.connection_closed();
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

 private:
  using Request = http::request<http::string_body>;

  // The completion this connection is answering.
  struct Completion {
    CompletionRequest request;
    std::vector<std::shared_ptr<Sequence>> sequences;
    std::string id;
    int64_t created = 0;
    std::vector<std::string> text;
    std::vector<std::vector<int64_t>> token_ids;
    std::vector<FinishReason> finish;
    size_t finished = 0;
    int64_t completion_tokens = 0;
    bool keep_alive = true;
    bool chunked = true;       // HTTP/1.1: chunked transfer; 1.0: the stream ends with the connection
    bool stream_done = false;  // every byte of the stream is queued
  };

  void read_request() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(server_.options.max_body_bytes));
    parser_->header_limit(kHeaderLimit);
    // One deadline for the whole request: idle keep-alive, slow headers and slow bodies alike.
    stream_.expires_after(millis(server_.options.read_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // A client that sends `Expect: 100-continue` (curl, for bodies over 1 KiB) waits for our go-ahead
  // before the body; without it curl waits a second.
  void on_header(beast::error_code ec) {
    if (ec) return on_read(ec);
    const auto expect = parser_->get()[http::field::expect];
    if (!parser_->is_done() && beast::iequals(expect, "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      return net::async_write(stream_, net::buffer(kContinue),
                              [self = shared_from_this()](beast::error_code ec, size_t) {
                                if (ec) return self->close();
                                self->read_body();
                              });
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset) {
      return close();  // the client left, or was too slow: nothing to answer
    }
    if (ec == http::error::body_limit) {
      return send_error(413, "", "request body exceeds " + std::to_string(server_.options.max_body_bytes) + " bytes",
                        true);
    }
    if (ec == http::error::header_limit) {
      return send_error(431, "", "request headers exceed " + std::to_string(kHeaderLimit) + " bytes", true);
    }
    if (ec) {
      if (ec.category() == http::make_error_code(http::error::bad_target).category()) {  // a malformed request
        return send_error(400, "", "malformed HTTP request: " + ec.message(), true);
      }
      return close();
    }
    handle(parser_->get());
  }

  void handle(Request& req) {
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    std::string_view target(req.target().data(), req.target().size());
    target = target.substr(0, target.find('?'));
    const auto& key = server_.options.api_key;
    if (!key.empty()) {
      const auto auth = req[http::field::authorization];
      if (!authorized(std::string_view(auth.data(), auth.size()), key)) {
        return send_error(401, "", "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                          !keep_alive_);
      }
    }
    if (server_.draining) return send_error(503, "", "the server is shutting down", true);
    const auto method = req.method();
    auto only = [&](http::verb verb) {
      if (method == verb) return true;
      send_error(405, "", "use " + std::string(http::to_string(verb)) + " for " + std::string(target), !keep_alive_);
      return false;
    };
    if (target == "/v1/completions") {
      if (only(http::verb::post)) start_completion(req);
    } else if (target == "/health") {
      if (only(http::verb::get)) send(200, "application/json", "{\"status\":\"ok\"}\n", !keep_alive_);
    } else if (target == "/v1/models") {
      if (only(http::verb::get)) send(200, "application/json", models_body(), !keep_alive_);
    } else if (target == "/metrics") {
      if (only(http::verb::get))
        send(200, "text/plain; version=0.0.4; charset=utf-8", server_.metrics.render(), !keep_alive_);
    } else {
      send_error(
          404, "",
          "no route " + std::string(target) + " (POST /v1/completions, GET /v1/models, GET /health, GET /metrics)",
          !keep_alive_);
    }
  }

  std::string models_body() const {
    json::Value model = {{"id", server_.limits.model_name},
                         {"object", "model"},
                         {"created", 0},
                         {"owned_by", "gpt2-dist"},
                         {"max_model_len", server_.limits.block_size}};
    return json::dump(json::Value{{"object", "list"}, {"data", json::Value::array({model})}}) + "\n";
  }

  // Writes a whole response; then the next request, or (close) the end of the connection.
  void send(int status, const std::string& content_type, std::string body, bool close_after,
            bool ends_completion = false) {
    auto res = std::make_shared<Response>(static_cast<http::status>(status), version_);
    res->set(http::field::server, "gpt2-serve");
    res->set(http::field::content_type, content_type);
    if (status == 401) res->set(http::field::www_authenticate, "Bearer");
    if (status == 503) res->set(http::field::retry_after, "1");
    res->keep_alive(!close_after);
    res->body() = std::move(body);
    res->prepare_payload();
    server_.metrics.request_answered(status);
    stream_.expires_after(millis(server_.options.write_timeout_s));
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res, close_after, ends_completion](beast::error_code ec, size_t) {
                        self->stream_.expires_never();
                        if (ends_completion) self->release_completion();
                        if (ec) return self->close();
                        if (close_after) return self->linger_close();
                        self->read_request();
                      });
  }

  void send_error(int status, const std::string& param, const std::string& message, bool close_after,
                  bool ends_completion = false) {
    send(status, "application/json", error_body(status, param, message), close_after, ends_completion);
  }

  void start_completion(const Request& req) {
    auto c = std::make_unique<Completion>();
    try {
      c->request = parse_completion_request(req.body(), server_.tokenizer, server_.limits);
    } catch (const RequestError& e) {
      return send_error(e.status(), e.param(), e.what(), !keep_alive_);
    } catch (const std::exception& e) {  // nothing the client sends should get here: a bug, said so
      log::error("gpt2-serve: unexpected error reading a request: ", e.what());
      return send_error(500, "", std::string("internal error: ") + e.what(), true);
    }
    const auto& r = c->request;
    uint64_t seed = r.seed;
    if (!r.has_seed) {
      std::lock_guard<std::mutex> lock(server_.seeds_mu);
      seed = server_.seeds();
    }
    const auto arrived = Clock::now();
    const uint64_t generation = ++generation_;
    std::vector<SequenceSpec> specs(r.prompts.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      auto& s = specs[i];
      s.prompt = r.prompts[i];
      s.sampling.max_new_tokens = r.max_tokens;
      s.sampling.temperature = r.temperature;
      s.sampling.top_k = r.top_k;
      s.sampling.top_p = r.top_p;
      s.sampling.seed = seed + i;  // choice 0 samples as gpt2-generate --seed does for one prompt
      s.sampling.stop_token = r.stop_token;
      s.stop = r.stop;
      s.arrived = arrived;
      // Runs on the scheduler thread: hand the event to this connection's strand and return.
      s.on_event = [weak = weak_from_this(), ex = stream_.get_executor(), generation, i](SequenceEvent event) {
        net::post(ex, [weak, generation, i, event = std::move(event)]() mutable {
          if (auto self = weak.lock()) self->on_event(generation, i, std::move(event));
        });
      };
    }
    c->sequences = server_.scheduler.submit(std::move(specs));
    if (c->sequences.empty()) {
      return send_error(503, "",
                        "the queue is full (" + std::to_string(server_.scheduler.options().max_queue) +
                            " waiting sequences, --max_queue); retry later",
                        !keep_alive_);
    }
    const size_t n = r.prompts.size();
    c->id = "cmpl-" + std::to_string(++server_.next_id);
    c->created = static_cast<int64_t>(std::time(nullptr));
    c->text.resize(n);
    c->token_ids.resize(n);
    c->finish.assign(n, FinishReason::kNone);
    c->keep_alive = keep_alive_;
    c->chunked = version_ >= 11;
    completion_ = std::move(c);
    ++server_.in_flight;
    if (completion_->request.stream) {
      std::string head =
          "HTTP/1." + std::to_string(version_ % 10) +
          " 200 OK\r\nServer: gpt2-serve\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n";
      head += completion_->chunked ? "Transfer-Encoding: chunked\r\n" : "";
      head += completion_->keep_alive && completion_->chunked ? "" : "Connection: close\r\n";
      write_raw(head + "\r\n");
      server_.metrics.request_answered(200);
    }
    watch_for_disconnect(generation);
  }

  json::Value choice_json(size_t i, const std::string& text, FinishReason reason,
                          const std::vector<int64_t>* ids) const {
    json::Value choice = {
        {"index", i},
        {"text", text},
        {"logprobs", json::Value()},
        {"finish_reason", reason == FinishReason::kNone ? json::Value() : json::Value(finish_reason_name(reason))}};
    if (ids != nullptr) choice["token_ids"] = *ids;
    return choice;
  }

  json::Value envelope(const Completion& c) const {
    return {{"id", c.id}, {"object", "text_completion"}, {"created", c.created}, {"model", server_.limits.model_name}};
  }

  json::Value usage(const Completion& c) const {
    int64_t prompt_tokens = 0;
    for (const auto& p : c.request.prompts) prompt_tokens += static_cast<int64_t>(p.size());
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", c.completion_tokens},
            {"total_tokens", prompt_tokens + c.completion_tokens}};
  }

  void on_event(uint64_t generation, size_t i, SequenceEvent event) {
    if (!completion_ || generation != generation_) return;  // a request already answered or abandoned
    Completion& c = *completion_;
    c.text[i] += event.text;
    c.token_ids[i].insert(c.token_ids[i].end(), event.token_ids.begin(), event.token_ids.end());
    if (event.finished != FinishReason::kNone) {
      c.finish[i] = event.finished;
      c.completion_tokens += event.completion_tokens;
      ++c.finished;
    }
    const bool all_done = c.finished == c.finish.size();
    const bool failed = event.finished == FinishReason::kCancelled || event.finished == FinishReason::kError;
    if (c.request.stream) {
      if (failed) {
        const int status = event.finished == FinishReason::kError ? 500 : 503;
        const std::string msg = status == 500 ? "the model failed on this request (see the server log)"
                                              : "the request was cancelled (the server is shutting down)";
        std::string error = error_body(status, "", msg);
        error.pop_back();  // its newline: the event adds its own
        write_event(error);
      } else if (!event.text.empty() || event.finished != FinishReason::kNone || c.request.return_token_ids) {
        json::Value body = envelope(c);
        body["choices"] = json::Value::array(
            {choice_json(i, event.text, event.finished, c.request.return_token_ids ? &event.token_ids : nullptr)});
        if (c.request.include_usage) body["usage"] = json::Value();
        write_event(json::dump(body));
      }
      if (all_done) {
        if (c.request.include_usage) {
          json::Value body = envelope(c);
          body["choices"] = json::Value::array();
          body["usage"] = usage(c);
          write_event(json::dump(body));
        }
        write_event("[DONE]");
        if (c.chunked) write_raw("0\r\n\r\n");
        c.stream_done = true;
        if (!writing_) finish_stream();
      }
      return;
    }
    if (!all_done) return;
    for (FinishReason f : c.finish) {
      if (f == FinishReason::kError)
        return send_error(500, "", "the model failed on this request (see the server log)", true, true);
      if (f == FinishReason::kCancelled)
        return send_error(503, "", "the request was cancelled (the server is shutting down)", true, true);
    }
    json::Value body = envelope(c);
    body["choices"] = json::Value::array();
    for (size_t k = 0; k < c.text.size(); ++k) {
      body["choices"].push_back(
          choice_json(k, c.text[k], c.finish[k], c.request.return_token_ids ? &c.token_ids[k] : nullptr));
      if (c.request.return_token_ids) body["choices"][k]["prompt_token_ids"] = c.request.prompts[k];
    }
    body["usage"] = usage(c);
    send(200, "application/json", json::dump(body) + "\n", !c.keep_alive, true);
  }

  // One server-sent event: `data: <payload>` and a blank line, in its own HTTP chunk.
  void write_event(const std::string& payload) {
    const std::string event = "data: " + payload + "\n\n";
    write_raw(completion_->chunked ? chunk(event) : event);
  }

  void write_raw(std::string bytes) {
    out_.push_back(std::move(bytes));
    if (!writing_) do_write();
  }

  void do_write() {
    if (out_.empty() || closed_) {
      writing_ = false;
      return;
    }
    writing_ = true;
    stream_.expires_after(millis(server_.options.write_timeout_s));  // a client that stops reading is dropped
    net::async_write(stream_, net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->stream_.expires_never();
      self->out_.pop_front();
      if (ec) {
        self->writing_ = false;
        return self->client_gone();
      }
      if (!self->out_.empty()) return self->do_write();
      self->writing_ = false;
      if (self->completion_ && self->completion_->stream_done) self->finish_stream();
    });
  }

  void finish_stream() {
    const bool keep = completion_->keep_alive && completion_->chunked;
    release_completion();
    if (keep) return read_request();
    close();
  }

  // While a completion runs nobody reads the socket: wait for it to turn readable, and tell a
  // closed connection (a read of 0 bytes) from a client that sent more (left for the next read).
  void watch_for_disconnect(uint64_t generation) {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), generation](beast::error_code ec) {
      if (ec || !self->completion_ || generation != self->generation_) return;
      char byte;
      const ssize_t n = ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return self->client_gone();
      if (n < 0) return self->watch_for_disconnect(generation);
      // n > 0: a pipelined request; the client is there. A later departure shows as a failed write.
    });
  }

  void client_gone() {
    if (completion_) server_.metrics.client_gone();
    close();
  }

  // The completion is answered (or abandoned): cancel what still runs, count it out.
  void release_completion() {
    if (!completion_) return;
    for (const auto& s : completion_->sequences) Scheduler::cancel(s);
    completion_.reset();
    ++generation_;
    --server_.in_flight;
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    release_completion();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);  // errors here mean it is gone already
    stream_.close();
  }

  // After refusing a request whose body is still arriving: stop sending, read and drop what the
  // client still sends (for a bounded time), then close, so the client reads our answer instead
  // of a connection reset.
  void linger_close() {
    if (closed_) return;
    release_completion();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    stream_.expires_after(millis(kLingerSeconds));
    drain_input();
  }

  void drain_input() {
    scratch_.resize(64 * 1024);
    stream_.async_read_some(net::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->drain_input();
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Server::Impl& server_;
  std::unique_ptr<Completion> completion_;
  uint64_t generation_ = 0;  // tells events of the current completion from late ones
  std::deque<std::string> out_;
  std::string scratch_;
  bool writing_ = false;
  bool closed_ = false;
  bool keep_alive_ = true;
  unsigned version_ = 11;
};

}  // namespace

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (!acceptor.is_open()) return;  // draining
    if (ec) {
      // Out of descriptors, or a connection reset before we took it: say so, pause, go on.
      log::warn("gpt2-serve: accept failed: ", ec.message());
      timer.expires_after(std::chrono::milliseconds(50));
      timer.async_wait([this](beast::error_code) { accept(); });
      return;
    }
    beast::error_code ignored;  // a client gone already: nothing to do about it
    if (connections >= options.max_connections) {
      // Too many open: say so without a session (the answer fits any socket buffer), and close.
      static const std::string kBusy = [] {
        const std::string body = error_body(503, "", "too many connections (--max_connections); retry later");
        return "HTTP/1.1 503 Service Unavailable\r\nServer: gpt2-serve\r\nContent-Type: application/json\r\n"
               "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body;
      }();
      socket.non_blocking(true, ignored);
      socket.send(net::buffer(kBusy), 0, ignored);
      socket.shutdown(tcp::socket::shutdown_send, ignored);
      socket.close(ignored);
      metrics.request_answered(503);
      return accept();
    }
    socket.set_option(tcp::no_delay(true), ignored);  // stream chunks go out as they come
    std::make_shared<Session>(std::move(socket), *this)->start();
    accept();
  });
}

void Server::Impl::on_signal() {
  log::info("gpt2-serve: stop signal: no new connections; finishing ", in_flight.load(),
            " request(s) in flight (up to ", options.shutdown_timeout_s, " s)");
  draining = true;
  beast::error_code ec;
  acceptor.close(ec);
  timer.cancel();
  drain_deadline = std::chrono::steady_clock::now() + millis(options.shutdown_timeout_s);
  poll_drain();
}

void Server::Impl::poll_drain() {
  if (in_flight == 0) return ioc.stop();
  const auto now = std::chrono::steady_clock::now();
  if (!cancelled_all && now >= drain_deadline) {
    log::warn("gpt2-serve: ", in_flight.load(), " request(s) still running after ", options.shutdown_timeout_s,
              " s: cancelling them");
    scheduler.cancel_all();
    cancelled_all = true;
    drain_deadline = now + std::chrono::seconds(5);  // their cancelled answers; then stop regardless
  } else if (cancelled_all && now >= drain_deadline) {
    return ioc.stop();
  }
  timer.expires_after(std::chrono::milliseconds(20));
  timer.async_wait([this](beast::error_code) { poll_drain(); });
}

Server::Server(ServerOptions options, Scheduler& scheduler, const data::Gpt2Tokenizer& tokenizer,
               const CompletionLimits& limits, Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(options), scheduler, tokenizer, limits, metrics)) {}

Server::~Server() = default;

uint16_t Server::listen() {
  auto& o = impl_->options;
  beast::error_code ec;
  const auto address = net::ip::make_address(o.host, ec);
  if (ec) throw UserError("--host = " + o.host + ": not an IP address (" + ec.message() + ")");
  const tcp::endpoint endpoint(address, o.port);
  auto& acceptor = impl_->acceptor;
  auto step = [&](const char* what, auto&& call) {
    call();
    if (ec) {
      throw UserError("--host = " + o.host + " --port = " + std::to_string(o.port) + ": cannot " + what + ": " +
                      ec.message());
    }
  };
  step("open a socket", [&] { acceptor.open(endpoint.protocol(), ec); });
  step("set SO_REUSEADDR", [&] { acceptor.set_option(net::socket_base::reuse_address(true), ec); });
  step("bind", [&] { acceptor.bind(endpoint, ec); });
  step("listen", [&] { acceptor.listen(net::socket_base::max_listen_connections, ec); });
  return acceptor.local_endpoint().port();
}

void Server::run() {
  auto& s = *impl_;
  s.signals.async_wait([&s](beast::error_code ec, int) {
    if (!ec) s.on_signal();
  });
  net::dispatch(s.control, [&s] { s.accept(); });
  // A handler that throws (out of memory, a bug) loses its connection, not the server: log, run on.
  auto serve = [&s] {
    for (;;) {
      try {
        s.ioc.run();
        return;
      } catch (const std::exception& e) {
        log::error("gpt2-serve: a connection handler failed: ", e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < s.options.io_threads; ++i) threads.push_back(start_helper_thread(serve));
  serve();  // this thread takes the signals (the helpers block them)
  for (auto& t : threads) t.join();
}

}  // namespace gpt2::serve
