#include "hf_download.h"

#include <fmt/format.h>
#include <httplib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"

namespace bmoe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string env_or(const char* name, const std::string& fallback = {}) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// The hub cache folder, by the variables llama.cpp and huggingface_hub read, in their order.
fs::path cache_dir() {
  const std::pair<const char*, fs::path> vars[] = {{"LLAMA_CACHE", {}},
                                                   {"HF_HUB_CACHE", {}},
                                                   {"HUGGINGFACE_HUB_CACHE", {}},
                                                   {"HF_HOME", "hub"},
                                                   {"XDG_CACHE_HOME", fs::path("huggingface") / "hub"},
                                                   {"HOME", fs::path(".cache") / "huggingface" / "hub"}};
  for (const auto& [name, sub] : vars) {
    const std::string v = env_or(name);
    if (!v.empty()) return sub.empty() ? fs::path(v) : fs::path(v) / sub;
  }
  fail("-hf: no cache folder (set LLAMA_CACHE or HOME)");
}

// "user/model[:QUANT]" split and checked (letters, digits, _ . -, exactly one '/').
std::pair<std::string, std::string> split_repo_tag(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string repo = spec.substr(0, colon);
  const std::string tag = colon == std::string::npos ? "" : spec.substr(colon + 1);
  static const std::regex kRepo(R"([A-Za-z0-9_][A-Za-z0-9_.-]*/[A-Za-z0-9_][A-Za-z0-9_.-]*)");
  static const std::regex kTag(R"([A-Za-z0-9_.-]*)");
  if (!std::regex_match(repo, kRepo) || repo.find("..") != std::string::npos || !std::regex_match(tag, kTag)) {
    fail("-hf {}: expected user/model[:quant]", spec);
  }
  return {repo, tag};
}

// A connection to the endpoint; requests carry the token and follow redirects (to a CDN).
class Hub {
 public:
  Hub() : base_(env_or("MODEL_ENDPOINT", env_or("HF_ENDPOINT", "https://huggingface.co/"))) {
    if (base_.back() != '/') base_ += '/';
    static const std::regex kUrl(R"((https?://[^/]+)(/.*))");
    std::smatch m;
    if (!std::regex_match(base_, m, kUrl)) fail("-hf: the endpoint {} is not an http(s) URL", base_);
    client_ = std::make_unique<httplib::Client>(m[1].str());
    path_ = m[2].str();
    client_->set_follow_location(true);
    client_->set_connection_timeout(10, 0);
    client_->set_read_timeout(60, 0);
    headers_ = {{"User-Agent", "bmoe/" BMOE_VERSION}};
    if (const std::string token = env_or("HF_TOKEN"); !token.empty()) headers_.emplace("Authorization", "Bearer " + token);
  }
  const std::string& base() const { return base_; }

  json get_json(const std::string& rel) {
    httplib::Headers h = headers_;
    h.emplace("Accept", "application/json");
    const auto res = client_->Get(path_ + rel, h);
    if (!res) throw Offline(fmt::format("cannot reach {} ({})", base_, httplib::to_string(res.error())));
    if (res->status != 200) fail("-hf: GET {}{}: HTTP {}{}", base_, rel, res->status, res->status == 401 ? " (set HF_TOKEN?)" : "");
    try {
      return json::parse(res->body);
    } catch (const json::exception&) {
      fail("-hf: GET {}{}: not JSON", base_, rel);
    }
  }

  // Appends the file's bytes from `have` on to `out`; false when the transfer broke off.
  bool download(const std::string& rel, uint64_t have, std::ofstream& out, uint64_t& total, const std::string& name);

  struct Offline : Error {
    using Error::Error;
  };

 private:
  std::string base_, path_;
  std::unique_ptr<httplib::Client> client_;
  httplib::Headers headers_;
};

// The download's progress on stderr: redrawn in place on a terminal, by quarters otherwise.
void show_progress(const std::string& name, uint64_t done, uint64_t total, int& shown) {
  const int pct = total ? static_cast<int>(100 * done / total) : 0;
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  if (tty ? pct == shown : pct / 25 == shown / 25) return;
  shown = pct;
  fmt::print(stderr, "{}download: {} {:3d} % ({:.1f} / {:.1f} MiB){}", tty ? "\r" : "", name, pct, done / 1048576.0,
             total / 1048576.0, tty && pct < 100 ? "" : "\n");
}

bool Hub::download(const std::string& rel, uint64_t have, std::ofstream& out, uint64_t& total, const std::string& name) {
  httplib::Headers h = headers_;
  if (have > 0) h.emplace("Range", fmt::format("bytes={}-", have));
  uint64_t done = have;
  int shown = -1;
  bool refused = false;
  const auto res = client_->Get(
      path_ + rel, h,
      [&](const httplib::Response& r) {
        refused = r.status != (have > 0 ? 206 : 200);
        if (!refused && r.has_header("Content-Length")) total = done + std::stoull(r.get_header_value("Content-Length"));
        return !refused;
      },
      [&](const char* data, size_t n) {
        out.write(data, static_cast<std::streamsize>(n));
        done += n;
        show_progress(name, done, total, shown);
        return static_cast<bool>(out);
      });
  if (!res && !refused && done == have) throw Offline(fmt::format("cannot reach {} ({})", base_, httplib::to_string(res.error())));
  if (refused) fail("-hf: GET {}{}: HTTP {}", base_, rel, res ? res->status : 0);
  return res && done == total;
}

struct RepoFile {
  std::string path, oid;
};

std::string main_commit(Hub& hub, const std::string& repo) {
  const json refs = hub.get_json("api/models/" + repo + "/refs");
  std::string commit;
  static const std::regex kCommit("[0-9a-f]{40}");
  for (const json& b : refs.value("branches", json::array())) {
    if (!b.is_object() || !b.value("targetCommit", json()).is_string()) continue;
    const std::string c = b["targetCommit"];
    if (!std::regex_match(c, kCommit)) continue;
    if (b.value("name", json()) == "main") return c;
    if (commit.empty()) commit = c;
  }
  if (commit.empty()) fail("-hf {}: the repository has no branch", repo);
  return commit;
}

std::vector<RepoFile> repo_files(Hub& hub, const std::string& repo, const std::string& commit) {
  std::vector<RepoFile> files;
  static const std::regex kOid("[0-9a-f]{40}|[0-9a-f]{64}");
  for (const json& f : hub.get_json("api/models/" + repo + "/tree/" + commit + "?recursive=true")) {
    if (!f.is_object() || f.value("type", json()) != "file" || !f.value("path", json()).is_string()) continue;
    RepoFile r{f["path"], ""};
    if (f.contains("lfs") && f["lfs"].is_object() && f["lfs"].value("oid", json()).is_string()) r.oid = f["lfs"]["oid"];
    else if (f.value("oid", json()).is_string()) r.oid = f["oid"];
    const fs::path p(r.path);
    const bool safe = !p.is_absolute() && std::none_of(p.begin(), p.end(), [](const fs::path& c) { return c == ".."; });
    if (safe && std::regex_match(r.oid, kOid)) files.push_back(r);
  }
  return files;
}

bool is_model_file(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return name.ends_with(".gguf") && name.find("mmproj") == std::string::npos && name.find("imatrix") == std::string::npos;
}

// The model's files in shard order: --hf-file, else by quant tag (default Q4_K_M, then Q8_0,
// then the first GGUF), with every shard of a split model.
std::vector<RepoFile> choose_files(const std::vector<RepoFile>& files, const std::string& tag, const std::string& wanted,
                                   const std::string& repo) {
  const RepoFile* first = nullptr;
  const auto first_shard = [](const RepoFile& f) {
    const auto split = parse_split_name(f.path);
    return !split || split->index == 1;
  };
  if (!wanted.empty()) {
    for (const RepoFile& f : files) first = f.path == wanted ? &f : first;
  } else {
    const std::vector<std::string> tags = tag.empty() ? std::vector<std::string>{"Q4_K_M", "Q8_0", ""} : std::vector{tag};
    for (const std::string& t : tags) {
      const std::regex pattern(t.empty() ? std::string(".") : t + "[.-]", std::regex::icase);
      for (const RepoFile& f : files) {
        if (!first && is_model_file(f.path) && first_shard(f) && std::regex_search(f.path, pattern)) first = &f;
      }
    }
  }
  if (!first) fail("-hf {}: no {} in the repository", repo, wanted.empty() ? (tag.empty() ? "GGUF file" : tag + " GGUF file") : wanted);
  const auto split = parse_split_name(first->path);
  if (!split) return {*first};
  std::vector<RepoFile> shards;
  for (const RepoFile& f : files) {
    const auto s = parse_split_name(f.path);
    if (s && s->count == split->count && s->prefix == split->prefix) shards.push_back(f);
  }
  std::sort(shards.begin(), shards.end(), [](const RepoFile& a, const RepoFile& b) { return a.path < b.path; });
  if (static_cast<int>(shards.size()) != split->count) fail("-hf {}: {} has {} of its {} shards", repo, first->path, shards.size(), split->count);
  return shards;
}

// One file into blobs/{oid} (resumed from .downloadInProgress), linked from the snapshot.
void fetch_file(Hub& hub, const std::string& repo, const std::string& commit, const RepoFile& f, const fs::path& repo_dir) {
  const fs::path snapshot = repo_dir / "snapshots" / commit / f.path;
  if (fs::exists(snapshot)) return;
  const fs::path blob = repo_dir / "blobs" / f.oid;
  fs::create_directories(blob.parent_path());
  if (!fs::exists(blob)) {
    const fs::path partial = blob.string() + ".downloadInProgress";
    const uint64_t have = fs::exists(partial) ? fs::file_size(partial) : 0;
    if (have) fmt::print(stderr, "download: resuming {} at {:.1f} MiB\n", f.path, have / 1048576.0);
    std::ofstream out(partial, std::ios::binary | std::ios::app);
    if (!out) fail("-hf: cannot write {}", partial.string());
    uint64_t total = 0;
    const bool whole = hub.download(repo + "/resolve/" + commit + "/" + f.path, have, out, total, f.path);
    out.close();
    if (!whole || !out) fail("-hf: the download of {} broke off; run again to resume it", f.path);
    fs::rename(partial, blob);
  }
  fs::create_directories(snapshot.parent_path());
  fs::create_symlink(fs::relative(blob, snapshot.parent_path()), snapshot);
}

// Offline: the model from the cache, if an earlier run left it there.
std::string cached_model(const fs::path& repo_dir, const std::string& tag, const std::string& wanted, const std::string& repo) {
  std::ifstream ref(repo_dir / "refs" / "main");
  std::string commit;
  if (!ref || !std::getline(ref, commit)) return {};
  const fs::path snap = repo_dir / "snapshots" / commit;
  if (!fs::is_directory(snap)) return {};
  std::vector<RepoFile> files;
  for (const auto& e : fs::recursive_directory_iterator(snap)) {
    if (fs::exists(e.path())) files.push_back({e.path().lexically_relative(snap).generic_string(), ""});
  }
  try {
    return (snap / choose_files(files, tag, wanted, repo).front().path).string();
  } catch (const Error&) {
    return {};
  }
}

}  // namespace

std::string hf_fetch_model(const HfRequest& request) {
  const auto [repo, tag] = split_repo_tag(request.repo);
  const fs::path repo_dir = cache_dir() / ("models--" + std::regex_replace(repo, std::regex("/"), "--"));
  Hub hub;
  try {
    const std::string commit = main_commit(hub, repo);
    const std::vector<RepoFile> chosen = choose_files(repo_files(hub, repo, commit), tag, request.file, repo);
    for (const RepoFile& f : chosen) fetch_file(hub, repo, commit, f, repo_dir);
    fs::create_directories(repo_dir / "refs");
    std::ofstream(repo_dir / "refs" / "main") << commit;
    return (repo_dir / "snapshots" / commit / chosen.front().path).string();
  } catch (const Hub::Offline& e) {
    const std::string cached = cached_model(repo_dir, tag, request.file, repo);
    if (cached.empty()) fail("-hf {}: {}, and the cache {} does not hold it", request.repo, e.what(), cache_dir().string());
    fmt::print(stderr, "note: -hf {}: {}; using the cached {}\n", request.repo, e.what(), cached);
    return cached;
  }
}

}  // namespace bmoe
