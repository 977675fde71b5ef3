#include "cohort/elastic/error_file.h"

#include <c10/util/Exception.h>
#include <cxxabi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <exception>
#include <iostream>
#include <mutex>
#include <sstream>
#include <typeinfo>

#include "cohort/comm/environment.h"

namespace cohort::elastic {
namespace {

std::string type_name(const std::exception& e) {
  if (dynamic_cast<const c10::Error*>(&e)) return "c10::Error";
  int status = 0;
  char* demangled = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : typeid(e).name();
  std::free(demangled);
  return name;
}

// c10::Error's what() carries the C++ backtrace after the message; keep the message
// short and put the whole text in the detail.
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

std::string to_json(const ErrorRecord& record) {
  nlohmann::json j;
  j["message"]["message"] = record.message;
  j["message"]["extraInfo"]["py_callstack"] = record.detail;
  j["message"]["extraInfo"]["timestamp"] = std::to_string(record.timestamp);
  return j.dump();
}

bool write_error_file(const std::string& path, const ErrorRecord& record) {
  auto tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return false;
    out << to_json(record);
    if (!out.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Note [Bounded error files]: the file is the worker's, and its size is not ours to
// trust. The agent reads at most kMaxErrorFileBytes of it: a bigger one (it crashed
// the agent when the store refused its failure record over 64 MiB) is not parsed, and
// its message says so, with the first kTruncatedPrefixBytes as written.
std::optional<ErrorRecord> read_error_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  in.seekg(0, std::ios::end);
  const auto end = in.tellg();
  in.seekg(0, std::ios::beg);
  const std::uint64_t size = end < 0 ? 0 : static_cast<std::uint64_t>(end);
  ErrorRecord r;
  if (size > kMaxErrorFileBytes) {
    std::string prefix(kTruncatedPrefixBytes, '\0');
    in.read(prefix.data(), static_cast<std::streamsize>(prefix.size()));
    prefix.resize(static_cast<std::size_t>(std::max<std::streamsize>(in.gcount(), 0)));
    r.message = "(truncated: the error file " + path + " holds " + std::to_string(size) +
                " bytes, more than the " + std::to_string(kMaxErrorFileBytes) +
                " the launcher reads; its first " + std::to_string(prefix.size()) + " bytes follow) " + prefix;
    return r;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  try {
    auto j = nlohmann::json::parse(buf.str());
    const auto& m = j.at("message");
    if (m.is_string()) {
      r.message = m.get<std::string>();
    } else {
      r.message = m.at("message").get<std::string>();
      const auto& extra = m.value("extraInfo", nlohmann::json::object());
      r.detail = extra.value("py_callstack", "");
      auto ts = extra.value("timestamp", "0");
      r.timestamp = std::strtol(ts.c_str(), nullptr, 10);
    }
  } catch (const std::exception&) {
    r.message = buf.str();
  }
  return r;
}

namespace {

ErrorRecord record_of(const std::exception& e, const std::string& hint) {
  ErrorRecord r;
  std::string what = e.what();
  r.message = type_name(e) + ": " + first_line(what) + hint;
  r.detail = what;
  r.timestamp = static_cast<long>(std::time(nullptr));
  return r;
}

void write_if_asked(const ErrorRecord& r) {
  auto env = comm::process_environment();
  auto it = env.find("TORCHELASTIC_ERROR_FILE");
  if (it != env.end() && !it->second.empty() && !write_error_file(it->second, r))
    std::cerr << "cohort: could not write the error file " << it->second << "\n";
}

// What an abort from Gloo's own threads means, for the few we can tell apart.
std::string hint_for(const std::string& what) {
  if (what.find("op.preamble.length <= op.nbytes") != std::string::npos ||
      what.find("op.preamble.nbytes") != std::string::npos)
    return " (Gloo aborted the process: this rank received more bytes than its collective expects, so the ranks "
           "called different collectives, or the same one with different sizes; rerun with "
           "COHORT_CHECK_COLLECTIVES=1 on every rank to have each rank's call named, docs/ddp.md)";
  return "";
}

// Note [Exceptions no caller can catch]: Gloo's transport threads throw on a
// protocol violation (a peer's message longer than the receive buffer, when the
// ranks' collectives differ in size), and an exception leaving a thread's function
// ends the process through std::terminate, with no error file and a bare abort
// (exit 134) in the launcher's summary. record() therefore installs this handler
// for the life of the process: it writes the exception to the error file, with
// what it means where we know, and then hands over to the previous handler, which
// prints it and aborts as before. Process-wide by nature: one per process.
std::terminate_handler previous_terminate = nullptr;

[[noreturn]] void report_then_terminate() {
  if (auto current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      auto r = record_of(e, hint_for(e.what()));
      write_if_asked(r);
      std::cerr << "error: uncaught in a thread: " << r.message << std::endl;
    } catch (...) {
    }
  }
  if (previous_terminate) previous_terminate();
  std::abort();
}

}  // namespace

int record(const std::function<int()>& body) {
  static std::once_flag installed;
  std::call_once(installed, [] { previous_terminate = std::set_terminate(report_then_terminate); });
  try {
    return body();
  } catch (const std::exception& e) {
    const auto r = record_of(e, "");
    write_if_asked(r);
    std::cerr << "error: " << r.detail << std::endl;
    return 1;
  }
}

}  // namespace cohort::elastic
