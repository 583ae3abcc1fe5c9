#include "runtime/engine/trace.hpp"

#include <cerrno>
#include <fstream>
#include <system_error>

#include <nlohmann/json.hpp>

namespace strata::runtime {
namespace {

const char* track_name(TraceTrack track) {
  switch (track) {
    case TraceTrack::kIo:
      return "I/O (NVMe waits)";
    case TraceTrack::kCopies:
      return "copies and collectives";
    case TraceTrack::kCompute:
      return "compute";
    case TraceTrack::kOptimizer:
      return "optimizer";
  }
  return "?";
}

}  // namespace

Tracer::Tracer(std::size_t max_events) : max_events_(max_events), origin_(Clock::now()) {}

void Tracer::record(TraceTrack track, std::string name, Clock::time_point start,
                    Clock::time_point end) {
  std::lock_guard lock(mutex_);
  if (events_.size() >= max_events_) return;
  events_.push_back({track, std::move(name), start, end});
}

std::vector<Tracer::Event> Tracer::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

std::size_t Tracer::event_count() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

void Tracer::write_chrome_json(const std::filesystem::path& path) const {
  nlohmann::json events = nlohmann::json::array();
  {
    std::lock_guard lock(mutex_);
    for (TraceTrack track :
         {TraceTrack::kIo, TraceTrack::kCopies, TraceTrack::kCompute, TraceTrack::kOptimizer}) {
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", 1},
                        {"tid", static_cast<int>(track)},
                        {"args", {{"name", track_name(track)}}}});
    }
    const auto micros = [this](Clock::time_point t) {
      return std::chrono::duration<double, std::micro>(t - origin_).count();
    };
    for (const Event& event : events_) {
      events.push_back({{"name", event.name},
                        {"ph", "X"},
                        {"pid", 1},
                        {"tid", static_cast<int>(event.track)},
                        {"ts", micros(event.start)},
                        {"dur", micros(event.end) - micros(event.start)}});
    }
  }
  const std::filesystem::path temporary = path.string() + ".tmp";
  std::ofstream out(temporary, std::ios::trunc);
  if (!out) {
    throw std::system_error(errno, std::generic_category(),
                            "cannot write trace file " + temporary.string());
  }
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  out.close();
  if (!out) {
    throw std::system_error(errno, std::generic_category(), "writing trace file " + path.string());
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace strata::runtime
