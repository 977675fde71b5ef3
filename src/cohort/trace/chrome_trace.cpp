#include "cohort/trace/chrome_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "cohort/errors.h"

namespace cohort::trace {
namespace {

using nlohmann::json;

json metadata(const char* what, int pid, int tid, const std::string& name) {
  return {{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

json to_json(const Event& e, int pid, double offset_us) {
  json j = {{"name", e.name}, {"cat", e.category}, {"ph", std::string(1, static_cast<char>(e.kind))},
            {"ts", e.ts_us + offset_us}, {"pid", pid}, {"tid", e.tid}};
  json args = {{"step", e.step}};
  if (e.bytes >= 0) args["bytes"] = e.bytes;
  switch (e.kind) {
    case Event::Kind::kSpan: j["dur"] = e.dur_us; break;
    case Event::Kind::kInstant: j["s"] = "t"; break;
    case Event::Kind::kAsyncBegin:
    case Event::Kind::kAsyncEnd: j["id"] = e.id; break;
  }
  j["args"] = std::move(args);
  return j;
}

void write_json(const std::string& path, const json& doc) {
  std::ofstream out(path, std::ios::trunc);
  out << doc.dump() << "\n";
  out.close();
  if (!out) throw Error(fmt::format("cannot write the trace file {}; check that its directory is writable and has space", path));
}

}  // namespace

void write_chrome_trace(const std::string& path, const std::vector<Event>& events, const TraceFileInfo& info) {
  std::vector<const Event*> order;
  order.reserve(events.size());
  for (const auto& e : events) order.push_back(&e);
  // Note [Well-nested spans]: a span is recorded when it ends, so an enclosing span
  // comes after the spans inside it. Sorting by (thread, start, longest first) puts
  // every thread's events in start order with parents before children, which is
  // what the viewers expect.
  std::stable_sort(order.begin(), order.end(), [](const Event* a, const Event* b) {
    if (a->tid != b->tid) return a->tid < b->tid;
    if (a->ts_us != b->ts_us) return a->ts_us < b->ts_us;
    return a->dur_us > b->dur_us;
  });
  json list = json::array();
  list.push_back(metadata("process_name", info.rank, 0, fmt::format("rank {}", info.rank)));
  list.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", info.rank}, {"tid", 0},
                  {"args", {{"sort_index", info.rank}}}});
  for (std::size_t t = 0; t < std::max<std::size_t>(info.threads, 1); ++t)
    list.push_back(metadata("thread_name", info.rank, static_cast<int>(t), t == 0 ? "main" : fmt::format("thread {}", t)));
  if (!info.device.empty()) {
    list.push_back(metadata("thread_name", info.rank, kDeviceTrack, info.device + " (device time)"));
    list.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", info.rank}, {"tid", kDeviceTrack},
                    {"args", {{"sort_index", kDeviceTrack}}}});
  }
  for (const Event* e : order) list.push_back(to_json(*e, info.rank, info.clock_offset_us));
  json doc = {{"traceEvents", std::move(list)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"rank", info.rank},
                {"clock_offset_us", info.clock_offset_us},
                {"events", events.size()},
                {"dropped_events", info.dropped},
                {"device", info.device.empty() ? json(nullptr) : json(info.device)},
                {"device_events_unfinished", info.device_unfinished},
                {"recording_overhead_us", info.overhead_us}}}};
  write_json(path, doc);
}

MergeResult merge_chrome_traces(const std::string& directory, const std::string& out_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(directory, ec))
    throw Error(fmt::format("{} is not a directory; give the --timeline directory of a run", directory));
  const std::regex name(R"(rank-(\d+)\.json)");
  std::vector<std::pair<int, fs::path>> files;
  for (const auto& entry : fs::directory_iterator(directory)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, name)) files.emplace_back(std::stoi(m[1]), entry.path());
  }
  if (files.empty())
    throw Error(fmt::format("{} holds no rank-N.json file; run with `cohort run --timeline {}` first", directory,
                            directory));
  std::sort(files.begin(), files.end());
  MergeResult result;
  json merged = json::array();
  json ranks = json::object();
  for (const auto& [rank, path] : files) {
    json doc;
    try {
      std::ifstream in(path);
      doc = json::parse(in);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{} is not a readable trace file ({}); rerun rank {} or remove the file", path.string(),
                              e.what(), rank));
    }
    if (!doc.contains("traceEvents") || !doc["traceEvents"].is_array())
      throw Error(fmt::format("{} has no traceEvents array; it is not a cohort timeline", path.string()));
    for (auto& e : doc["traceEvents"]) {
      if (e.value("ph", "") != "M") ++result.events;
      merged.push_back(std::move(e));
    }
    ranks[std::to_string(rank)] = doc.value("otherData", json::object());
    result.ranks.push_back(rank);
  }
  write_json(out_path, {{"traceEvents", std::move(merged)}, {"displayTimeUnit", "ms"}, {"otherData", {{"ranks", ranks}}}});
  return result;
}

}  // namespace cohort::trace
