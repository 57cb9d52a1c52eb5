// bmoe-server: an OpenAI-compatible HTTP server for one model (llama-server's endpoints).
//
// One worker thread decodes requests from a bounded queue (serve/worker.h): one at a time, or
// with --parallel N in N slots decoded together (continuous batching); HTTP
// threads parse and validate requests (serve/request.h), tokenize, and wait for (or stream:
// serve/stream.h) their job's output. This file holds the flags, the routes and the client's
// connection. The model, its KV cache and its expert cache stay loaded; each request reuses
// the KV rows of the prefix it shares with the previous one. A full queue answers 503; a
// client that goes away cancels its job (streaming: the next write fails; non-streaming: its
// socket is polled for a hang-up while nothing is written, so that an error still gets its own
// HTTP status; see whole_response).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "chat/chat.h"
#include "core/error.h"
#include "core/version.h"
#include "engine/run.h"
#include "llama_flags.h"
#include "run_options.h"
#include "serve/anthropic_messages.h"
#include "serve/embeddings.h"
#include "serve/native_completion.h"
#include "serve/request.h"
#include "serve/responses_api.h"
#include "serve/response.h"
#include "serve/stream.h"
#include "serve/worker.h"
#include "text/utf8.h"
#include "web_index.h"  // kWebIndexHtml: tools/web/index.html, embedded at build time

using namespace bmoe;
using json = nlohmann::ordered_json;  // keys in the order OpenAI writes them

namespace {

struct ServerOptions {
  RunOptions run;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string alias;
  int queue = 8;
  int http_threads = 0;
  int n_predict = -1;
  SamplerConfig sampling = server_sampling_defaults();  // each request's defaults (no seed)
  bool no_think = false;
  bool ignore_eos = false;
  std::string reasoning_format = "deepseek";  // chat: a <think> block goes to reasoning_content
  std::string pooling;  // /v1/embeddings: mean, cls or last ("": the GGUF's, else mean)
  DraftConfig draft;  // resolved from run after load
};

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

// ---- the client's connection

// The socket of the request's connection, found among the process's descriptors by its peer
// and local ports and peer address (cpp-httplib 0.11 does not give it to handlers); -1 if none.
int client_socket(const httplib::Request& req) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string name = entry.path().filename().string();
    char* end = nullptr;
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str() || *end != '\0') continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof(peer), local_len = sizeof(local);
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    char host[NI_MAXHOST], peer_port[NI_MAXSERV], local_port[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&peer), peer_len, host, sizeof(host), peer_port, sizeof(peer_port),
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0 ||
        ::getnameinfo(reinterpret_cast<sockaddr*>(&local), local_len, nullptr, 0, local_port, sizeof(local_port),
                      NI_NUMERICSERV) != 0) {
      continue;
    }
    if (req.remote_addr == host && std::to_string(req.remote_port) == peer_port &&
        (req.local_port < 0 || std::to_string(req.local_port) == local_port)) {
      return static_cast<int>(fd);
    }
  }
  return -1;
}

// Whether the client closed its side (or the connection broke). Pipelined bytes waiting to
// be read are no hang-up.
bool client_hung_up(int sock) {
  pollfd p{sock, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

// ------------------------------------------------------------------ the server

// Whose error shapes a route answers in.
enum class ApiStyle { OpenAI, Anthropic };

json api_error(ApiStyle style, int status, const std::string& type, const std::string& message,
               const std::string& param = {}, const std::string& code = {}) {
  if (style == ApiStyle::Anthropic) return anthropic_error(status, message);
  return error_body(type, message, param, code);
}

// How one API writes a finished job: its answer, or its error body.
struct Answer {
  std::function<json(const Job&)> body;
  std::function<json(const Job&)> error;
};

class Server {
 public:
  Server(DecodeWorker& worker, const ServerOptions& o) : worker_(worker), o_(o) {
    model_name_ = utf8_sanitize(o.alias.empty() ? std::filesystem::path(o.run.config.model).filename().string() : o.alias);
    chat_template_ = chat_template_for(worker.run());
    tool_format_ = tool_format_of(chat_template_.source());
    const GgufModel& gguf = *worker.model().gguf;
    pooling_ = o.pooling == "cls" ? Pooling::Cls : o.pooling == "last" ? Pooling::Last : Pooling::Mean;
    if (o.pooling.empty()) pooling_ = pooling_of(gguf.get_int_or(worker.model().arch + ".pooling_type", 0), Pooling::Mean);
    max_token_bytes_ = worker.model().tokenizer->longest_token_bytes();
  }

  const std::string& chat_template_description() const { return chat_template_.description(); }

  void install(httplib::Server& http) {
    install_pages(http);
    install_models(http);
    install_tokens(http);
    http.Get("/props", guarded([this](const httplib::Request&, httplib::Response& res) { send_json(res, 200, props()); }));
    http.Get("/slots", guarded([this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, json::parse(worker_.slots().dump()));
    }));
    http.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
      res.set_content(worker_.prometheus(), "text/plain; version=0.0.4");
    }));
    // llama-server also answers these OpenAI routes without "/v1" (a base URL without it).
    http.Post(R"((?:/v1)?/chat/completions)", guarded([this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, true);
    }));
    http.Post("/v1/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, false);
    }));
    http.Post("/completion", guarded([this](const httplib::Request& req, httplib::Response& res) { complete_native(req, res); }));
    install_anthropic(http);
    install_responses(http);
    install_embeddings(http);
    // A GET on a POST route is 405 with Allow, not 404 (the route exists).
    for (const char* path : {R"((?:/v1)?/chat/completions)", "/v1/completions", "/completion", "/tokenize", "/detokenize", "/v1/messages",
                             "/v1/messages/count_tokens", R"((?:/v1)?/responses)", R"((?:/v1)?/responses/input_tokens)",
                             "/v1/embeddings"}) {
      http.Get(path, [](const httplib::Request& req, httplib::Response& res) {
        res.set_header("Allow", "POST");
        send_json(res, 405, error_body("invalid_request_error", fmt::format("{} takes POST, not GET", req.path)));
      });
    }
    install_error_handlers(http);
    // One line per request on stderr, as llama-server logs them.
    http.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      fmt::print(stderr, "request: {} {} {} {}\n", req.method, utf8_sanitize(req.path), req.remote_addr, res.status);
    });
  }

  // Waits (up to `limit`) until every accepted completion has been answered: at shutdown the
  // library stops writing responses once stopped, which would cut their error off.
  void wait_answered(std::chrono::seconds limit) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (responding_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  // /health, the web chat page and /stats.
  void install_pages(httplib::Server& http) {
    http.Get(R"((?:/v1)?/health)", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });
    // The web chat page: open without the API key (it holds no data; the page asks for the
    // key and sends it with its own requests).
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(kWebIndexHtml.data(), kWebIndexHtml.size(), "text/html; charset=utf-8");
    });
    http.Get("/stats", guarded([this](const httplib::Request&, httplib::Response& res) { send_json(res, 200, worker_.stats()); }));
  }

  json model_object() const { return {{"id", model_name_}, {"object", "model"}, {"created", 0}, {"owned_by", "bmoe"}}; }

  void install_models(httplib::Server& http) {
    http.Get(R"((?:/v1)?/models)", guarded([this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"object", "list"}, {"data", json::array({model_object()})}});
    }));
    http.Get(R"(/v1/models/(.+))", guarded([this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = req.matches[1];
      if (id != model_name_) {
        send_json(res, 404, error_body("invalid_request_error", fmt::format("The model '{}' does not exist", utf8_sanitize(id)),
                                       "model", "model_not_found"));
        return;
      }
      send_json(res, 200, model_object());
    }));
  }

  // llama-server's /tokenize and /detokenize.
  void install_tokens(httplib::Server& http) {
    http.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
      const TokenizeRequest r = parse_tokenize_request(req.body);
      const Tokenizer& tok = *worker_.model().tokenizer;
      const std::vector<int32_t> ids = tok.encode(r.content, true, r.add_special && tok.vocab().add_bos);
      json tokens = json::array();
      for (int32_t id : ids) {
        if (r.with_pieces) tokens.push_back({{"id", id}, {"piece", utf8_sanitize(tok.decode({id}, true))}});
        else tokens.push_back(id);
      }
      send_json(res, 200, {{"tokens", tokens}});
    }));
    http.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
      const Tokenizer& tok = *worker_.model().tokenizer;
      const std::vector<int32_t> ids = parse_detokenize_request(req.body, tok.vocab_size());
      send_json(res, 200, {{"content", utf8_sanitize(tok.decode(ids, true))}});
    }));
  }

  // GET /props: the request defaults and what is being served (llama-server's fields).
  json props() const {
    const ModelConfig& cfg = worker_.model().transformer->config();
    const SamplerConfig& d = o_.sampling;
    json settings = {{"n_ctx", worker_.n_ctx()}, {"n_predict", o_.n_predict}, {"temperature", d.temperature},
                     {"top_k", d.top_k}, {"top_p", d.top_p}, {"min_p", d.min_p},
                     {"presence_penalty", d.presence_penalty}, {"frequency_penalty", d.frequency_penalty},
                     {"repeat_penalty", d.repeat_penalty}, {"repeat_last_n", d.repeat_last_n},
                     {"ignore_eos", o_.ignore_eos}};
    return {{"default_generation_settings", settings},
            {"total_slots", worker_.run().config.parallel},
            {"model_alias", model_name_},
            {"model_path", utf8_sanitize(o_.run.config.model)},
            {"chat_format", chat_format_name(chat_template_.format())},
            {"chat_template_source", chat_template_.description()},
            {"tool_call_format", tool_format_name(tool_format_)},
            {"chat_template", utf8_sanitize(worker_.model().tokenizer->vocab().chat_template)},
            {"architecture", cfg.arch},
            {"reasoning_format", o_.reasoning_format},
            {"pooling", pooling_name(pooling_)},
            {"mode", {{"streaming", worker_.run().mode.stream}, {"reason", utf8_sanitize(worker_.run().mode.reason)}}},
            {"build_info", fmt::format("bmoe {}", BMOE_VERSION)}};
  }

  // The library's own errors (no route, body too large) and exceptions as OpenAI error bodies.
  static void install_error_handlers(httplib::Server& http) {
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string message = res.status == 404   ? "no such endpoint"
                                  : res.status == 405 ? "method not allowed"
                                  : res.status == 413 ? "request body too large"
                                                      : fmt::format("HTTP error {}", res.status);
      send_json(res, res.status, error_body(res.status == 404 ? "not_found_error" : "invalid_request_error", message));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string message = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
      }
      send_json(res, 500, error_body("server_error", message));
    });
  }

  // API key check (OpenAI's Authorization: Bearer, or Anthropic's x-api-key) and RequestError
  // -> the API's error body.
  Handler guarded(Handler h, ApiStyle style = ApiStyle::OpenAI) {
    return [this, h, style](const httplib::Request& req, httplib::Response& res) {
      if (!o_.api_key.empty() && req.get_header_value("Authorization") != "Bearer " + o_.api_key &&
          req.get_header_value("x-api-key") != o_.api_key) {
        worker_.count(&Counters::unauthorized);
        send_json(res, 401, api_error(style, 401, "authentication_error", "invalid or missing API key (Authorization: Bearer KEY)"));
        return;
      }
      try {
        h(req, res);
      } catch (const RequestError& e) {
        if (e.status == 400) worker_.count(&Counters::bad_request);
        send_json(res, e.status, api_error(style, e.status, e.type, e.what(), e.param, e.code));
      } catch (const Error& e) {
        worker_.count(&Counters::bad_request);
        send_json(res, 400, api_error(style, 400, "invalid_request_error", e.what()));
      }
    };
  }

  // A request's job, on the worker's queue; nullptr (after a 503) when it is full.
  std::shared_ptr<Job> submit(CompletionRequest& request, httplib::Response& res, ApiStyle style) {
    if (request.reasoning_budget.tokens > 0 && worker_.run().config.parallel > 1) {  // the slots keep no budget
      throw RequestError(400, "invalid_request_error", "a reasoning budget needs --parallel 1", "reasoning_budget_tokens");
    }
    auto job = std::make_shared<Job>();
    job->params = std::move(request.params);
    job->prompt = std::move(request.prompt);
    job->n = request.n * request.prompts;
    job->choice_prompts = std::move(request.choice_prompts);
    job->t_max_predict_ms = request.t_max_predict_ms;
    job->return_progress = request.return_progress && request.stream;
    job->timings_per_token = request.timings_per_token && request.stream;
    job->reasoning_budget = request.reasoning_budget;
    if (worker_.submit(job)) return job;
    refuse(res, style);
    return nullptr;
  }

  // The answer to a submitted job, streamed (`stream` set) or whole.
  void respond(const httplib::Request& req, httplib::Response& res, const std::shared_ptr<Job>& job, const Answer& answer,
               const std::shared_ptr<JobStream>& stream) {
    // Counted until the library is done with the response (it destroys the provider then).
    ++responding_;
    const auto responding = std::shared_ptr<void>(nullptr, [this](void*) { --responding_; });
    if (stream) stream_response(res, job, stream, responding);
    else whole_response(req, res, job, answer, responding);
  }

  // OpenAI's /v1/embeddings (serve/embeddings.h), on the same worker as the completions.
  void install_embeddings(httplib::Server& http) {
    http.Post("/v1/embeddings", guarded([this](const httplib::Request& req, httplib::Response& res) {
      EmbeddingsRequest request = parse_embeddings_request(req.body, *worker_.model().tokenizer, worker_.n_ctx());
      int tokens = 0;
      for (const auto& input : request.inputs) tokens += static_cast<int>(input.size());
      auto job = std::make_shared<Job>();
      job->embed_inputs = std::move(request.inputs);
      job->pooling = pooling_;
      if (!worker_.submit(job)) return refuse(res, ApiStyle::OpenAI);
      const bool base64 = request.base64;
      const std::string model = model_name_;
      const Answer answer{[base64, model, tokens](const Job& j) { return embeddings_response(j.embeddings, base64, model, tokens); },
                          [](const Job& j) { return job_error(j); }};
      respond(req, res, job, answer, nullptr);
    }));
  }

  // OpenAI's Responses API (serve/responses_api.h), and its input-token count.
  void install_responses(httplib::Server& http) {
    http.Post(R"((?:/v1)?/responses/input_tokens)", guarded([this](const httplib::Request& req, httplib::Response& res) {
      const ResponsesRequest request = parse_responses_request(req.body, request_context(), responses_);
      send_json(res, 200, {{"object", "response.input_tokens"}, {"input_tokens", request.chat.prompt.size()}});
    }));
    http.Post(R"((?:/v1)?/responses)", guarded([this](const httplib::Request& req, httplib::Response& res) {
      ResponsesRequest request = parse_responses_request(req.body, request_context(), responses_);
      const bool stream = request.chat.stream;
      std::string id = new_response_id("resp");
      id[4] = '_';
      ResponsesAnswer a{id, static_cast<int64_t>(std::time(nullptr)), model_name_, request.chat.reply,
                        std::move(request.history), std::move(request.echo), &responses_};
      const std::shared_ptr<Job> job = submit(request.chat, res, ApiStyle::OpenAI);
      if (!job) return;
      const Answer answer{[a](const Job& j) { return responses_response(a, j.results.front()); },
                          [](const Job& j) { return job_error(j); }};
      respond(req, res, job, answer, stream ? responses_stream(a) : nullptr);
    }));
  }

  // Anthropic's Messages API (serve/anthropic_messages.h).
  void install_anthropic(httplib::Server& http) {
    http.Post("/v1/messages", guarded([this](const httplib::Request& req, httplib::Response& res) {
      MessagesRequest request = parse_messages_request(req.body, request_context(), false);
      const int input_tokens = static_cast<int>(request.chat.prompt.size());
      const bool stream = request.chat.stream;
      MessagesAnswer a{new_response_id("msg").replace(3, 1, "_"), model_name_, request.chat.reply, request.stop_sequences,
                       worker_.model().tokenizer.get()};
      const std::shared_ptr<Job> job = submit(request.chat, res, ApiStyle::Anthropic);
      if (!job) return;
      const Answer answer{[a](const Job& j) { return messages_response(a, j.results.front()); },
                          [](const Job& j) { return anthropic_error(j.error_status, j.error); }};
      respond(req, res, job, answer, stream ? messages_stream(a, input_tokens) : nullptr);
    }, ApiStyle::Anthropic));
    http.Post("/v1/messages/count_tokens", guarded([this](const httplib::Request& req, httplib::Response& res) {
      const MessagesRequest request = parse_messages_request(req.body, request_context(), true);
      send_json(res, 200, {{"input_tokens", request.chat.prompt.size()}});
    }, ApiStyle::Anthropic));
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    CompletionRequest request = parse_completion_request(req.body, chat, request_context());
    const std::shared_ptr<Job> job = submit(request, res, ApiStyle::OpenAI);
    if (!job) return;
    Completion c{chat, std::move(request.reply), request.include_usage, new_response_id(chat ? "chatcmpl" : "cmpl"),
                 static_cast<int64_t>(std::time(nullptr)), model_name_, job->n, request.logprobs(),
                 worker_.model().tokenizer.get(), request.prompts, request.return_tokens, request.ping_seconds,
                 request.params.post_sampling_probs};
    const Answer answer{[c](const Job& j) { return full_response(c, j.results); },
                        [](const Job& j) { return job_error(j); }};
    respond(req, res, job, answer, request.stream ? std::make_shared<StreamWriter>(c) : nullptr);
  }

  // llama-server's own /completion (serve/native_completion.h): /v1/completions' request, with
  // n_predict unlimited by default (up to the context) and its own answer shape.
  void complete_native(const httplib::Request& req, httplib::Response& res) {
    RequestContext context = request_context();
    if (context.n_predict <= 0) context.n_predict = context.n_ctx;
    CompletionRequest request = parse_completion_request(req.body, false, context);
    NativeCompletion c{model_name_, worker_.model().tokenizer.get(), request.params.stop, request.return_tokens,
                       request.n * request.prompts, request.timings_per_token, request.logprobs(),
                       request.params.post_sampling_probs};
    request.timings_per_token = true;  // exact tokens_predicted in each streamed piece
    const std::shared_ptr<Job> job = submit(request, res, ApiStyle::OpenAI);
    if (!job) return;
    const Answer answer{[c](const Job& j) { return native_response(c, j); }, [](const Job& j) { return job_error(j); }};
    respond(req, res, job, answer, request.stream ? std::make_shared<NativeStream>(c) : nullptr);
  }

  // A job the worker did not take: 503, shutting down or busy.
  void refuse(httplib::Response& res, ApiStyle style) {
    res.set_header("Retry-After", "1");
    if (worker_.shutting_down()) return send_json(res, 503, api_error(style, 503, "server_shutting_down", kShuttingDown));
    send_json(res, 503, api_error(style, 503, "server_busy", fmt::format("the server is busy: {} requests are already "
                                                                         "waiting; retry later", o_.queue)));
  }

  // Non-streaming: the answer, or the error with its own HTTP status (500, 503 at shutdown),
  // once the job is done. Nothing may be written before: the first byte commits the status line.
  // A vanished client must still cancel its job, so the wait polls the connection's socket for
  // a hang-up. Where that socket cannot be found, the old way is kept: a space each second
  // (JSON allows leading whitespace), whose failed write notices the client, at the price of
  // a 200 for a late error.
  void whole_response(const httplib::Request& req, httplib::Response& res, const std::shared_ptr<Job>& job,
                      const Answer& answer, const std::shared_ptr<void>& responding) {
    const int sock = client_socket(req);
    if (sock < 0) return whitespace_response(res, job, answer, responding);
    std::unique_lock<std::mutex> lock(job->mutex);
    while (!job->changed.wait_for(lock, std::chrono::milliseconds(250), [&] { return job->done; })) {
      if (client_hung_up(sock)) {
        job->cancel.store(true);  // the worker skips it, or stops it at the next token
        return;
      }
    }
    // A plain body (not a provider): the library writes it even once stopping at shutdown.
    if (job->error.empty()) return send_json(res, 200, answer.body(*job));
    if (job->error_status == 503) res.set_header("Retry-After", "1");
    send_json(res, job->error_status, answer.error(*job));
  }

  void whitespace_response(httplib::Response& res, const std::shared_ptr<Job>& job, const Answer& answer,
                           const std::shared_ptr<void>& responding) {
    res.set_chunked_content_provider("application/json", [job, answer](size_t, httplib::DataSink& sink) {
      std::unique_lock<std::mutex> lock(job->mutex);
      if (!job->changed.wait_for(lock, std::chrono::seconds(1), [&] { return job->done; })) {
        lock.unlock();
        if (!sink.write(" ", 1)) {
          job->cancel.store(true);
          return false;
        }
        return true;
      }
      const std::string text = (job->error.empty() ? answer.body(*job) : answer.error(*job)).dump();
      sink.write(text.data(), text.size());
      sink.done();
      return true;
    }, [job, responding](bool) { job->cancel.store(true); });
  }

  // Server-sent events (serve/stream.h), one provider call a step.
  void stream_response(httplib::Response& res, const std::shared_ptr<Job>& job, const std::shared_ptr<JobStream>& writer,
                       const std::shared_ptr<void>& responding) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [job, writer](size_t, httplib::DataSink& sink) {
      const StreamSink out{[&sink](const std::string& text) { return sink.write(text.data(), text.size()); },
                           [&sink] { sink.done(); }};
      const bool ok = writer->step(*job, out);
      if (!ok) job->cancel.store(true);  // the client is gone
      return ok;
    }, [job, responding](bool) { job->cancel.store(true); });
  }

  RequestContext request_context() const {
    RequestContext c;
    c.tokenizer = worker_.model().tokenizer.get();
    c.chat_template = &chat_template_;
    c.n_ctx = worker_.n_ctx();
    c.n_predict = o_.n_predict;
    c.sampling = o_.sampling;
    c.no_think = o_.no_think;
    c.split_reasoning = o_.reasoning_format == "deepseek";
    c.tool_format = tool_format_;
    c.max_token_bytes = max_token_bytes_;
    c.ignore_eos = o_.ignore_eos;
    c.draft = o_.draft;
    return c;
  }

  DecodeWorker& worker_;
  const ServerOptions& o_;
  std::atomic<int> responding_{0};
  std::string model_name_;
  ChatTemplate chat_template_;
  ToolFormat tool_format_ = ToolFormat::None;  // how the template writes tool calls
  ResponseStore responses_;  // earlier Responses API answers, for previous_response_id
  Pooling pooling_ = Pooling::Mean;  // how /v1/embeddings pools
  size_t max_token_bytes_ = 0;  // the longest token's text (prompts surely too long are refused untokenized)
};

constexpr int kListenBacklog = 512;

int serve(const ServerOptions& o) {
  // Signals go to one waiting thread (blocked everywhere else), which stops the server.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  LoadedRun loaded = load_run(run_config(o.run));
  ServerOptions resolved = o;
  resolved.draft = draft_config(loaded);
  DecodeWorker worker(std::move(loaded), static_cast<size_t>(resolved.queue));
  Server api(worker, resolved);
  httplib::Server http;
  // Each connection holds an HTTP thread while it is open (the library has no event loop), so
  // slow or idle clients must not be able to take them all: many threads (cheap while they
  // wait), and reads that stall for 10 s close the connection.
  const int threads = o.http_threads > 0 ? o.http_threads : std::max(64, o.queue + 16);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_payload_max_length(16u << 20);
  http.set_read_timeout(10, 0);
  http.set_keep_alive_timeout(5);
  // The library's default sets SO_REUSEPORT, which let a second server bind the same busy port
  // and the kernel split connections between the two: address reuse only. The listening
  // socket's descriptor is kept to raise its backlog after bind (the library listens with 5).
  int listening = -1;
  http.set_socket_options([&listening](int sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (listening < 0) listening = sock;
  });
  api.install(http);
  if (!http.bind_to_port(o.host, o.port)) fail("cannot listen on {}:{} (in use, or not permitted)", o.host, o.port);
  if (listening >= 0) ::listen(listening, kListenBacklog);
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    fmt::print(stderr, "server: stopping (signal {}): the running request is cancelled, queued ones are answered\n", sig);
    worker.shutdown();
    api.wait_answered(std::chrono::seconds(10));
    http.stop();
  });
  fmt::print(stderr, "server: listening on http://{}:{} (chat: {}, {} slot{}, queue {}, {} HTTP threads{})\n", o.host,
             o.port, api.chat_template_description(), resolved.run.config.parallel,
             resolved.run.config.parallel > 1 ? "s" : "", o.queue, threads, o.api_key.empty() ? "" : ", API key required");
  http.listen_after_bind();
  pthread_kill(stopper.native_handle(), SIGTERM);  // if the server stopped by itself
  stopper.join();
  save_cache_file(worker.run());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bmoe-server: OpenAI-compatible HTTP server for a MoE GGUF model"};
  app.set_version_flag("--version", bmoe::version_text());
  ServerOptions o;
  add_run_flags(app, o.run);
  app.add_option("--host", o.host, "address to bind (default loopback only)")->capture_default_str();
  app.add_option("--port", o.port, "port")->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--api-key", o.api_key, "require 'Authorization: Bearer KEY' on every endpoint but /health");
  app.add_option("--alias", o.alias, "model name reported by /v1/models (default: the file name)");
  app.add_option("--queue", o.queue, "requests that may wait while one decodes; more get 503")->capture_default_str()->check(CLI::Range(0, 4096));
  app.add_option("--http-threads", o.http_threads, "HTTP worker threads (default: queue + 8, at least 16)")->check(CLI::Range(1, 4096));
  app.add_option("-n,--n-predict", o.n_predict, "default max_tokens (-1: up to the context for chat, 16 for completions)")->capture_default_str();
  add_sampling_flags(app, o.sampling, 2.0);  // a request's temperature goes up to 2 (OpenAI)
  app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past end-of-text tokens by default (as llama-server; the request's ignore_eos overrides)");
  app.add_flag("--no-think", o.no_think, "answer without reasoning by default (chat_template_kwargs.enable_thinking overrides)");
  app.add_option("--reasoning-format", o.reasoning_format,
                 "chat: deepseek puts an answer's leading <think> block in message.reasoning_content "
                 "(delta.reasoning_content when streaming); none leaves it in content")
      ->capture_default_str()->check(CLI::IsMember({"deepseek", "none"}));
  app.add_option("--pooling", o.pooling, "/v1/embeddings: mean, cls or last (default: the model's pooling_type, else mean)")
      ->check(CLI::IsMember({"mean", "cls", "last"}));
  if (const std::optional<int> status = parse_command_line(app, argc, argv)) return *status;
  if (!utf8_valid(o.alias)) {
    fmt::print(stderr, "error: --alias must be valid UTF-8\n");
    return 2;
  }
  try {
    check_output_path(o.run.config.cache_file, "--cache-file");
    return serve(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
