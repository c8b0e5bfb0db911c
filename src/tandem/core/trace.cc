#include "tandem/core/trace.h"

#include "tandem/core/file_io.h"

namespace tandem {

void TraceRecorder::slice(std::string_view lane, std::string name, double begin_us, double end_us,
                          nlohmann::json args) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) {
    it = lanes_.emplace(std::string(lane), static_cast<int>(lane_names_.size())).first;
    lane_names_.emplace_back(lane);
  }
  slices_.push_back({it->second, std::move(name), begin_us, end_us, std::move(args)});
}

size_t TraceRecorder::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slices_.size();
}

void TraceRecorder::write(const std::filesystem::path& path) const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json events = nlohmann::json::array();
  events.push_back(
      {{"ph", "M"}, {"pid", 1}, {"name", "process_name"}, {"args", {{"name", "tandem"}}}});
  for (size_t lane = 0; lane < lane_names_.size(); lane++) {
    events.push_back({{"ph", "M"},
                      {"pid", 1},
                      {"tid", lane},
                      {"name", "thread_name"},
                      {"args", {{"name", lane_names_[lane]}}}});
    events.push_back({{"ph", "M"},
                      {"pid", 1},
                      {"tid", lane},
                      {"name", "thread_sort_index"},
                      {"args", {{"sort_index", lane}}}});
  }
  for (const Slice& s : slices_) {
    nlohmann::json event = {{"ph", "X"},      {"pid", 1},         {"tid", s.lane},
                            {"name", s.name}, {"ts", s.begin_us}, {"dur", s.end_us - s.begin_us}};
    if (!s.args.is_null()) event["args"] = s.args;
    events.push_back(std::move(event));
  }
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  write_file_atomic(path,
                    nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump());
}

}  // namespace tandem
