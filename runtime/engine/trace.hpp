// Tracer: a timeline of what the runtime did, written as a Chrome trace (chrome://tracing,
// Perfetto: "X" complete events), one track per kind of work so overlap is visible at a glance.
// Thread-safe; bounded (events past max_events are dropped).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace strata::runtime {

enum class TraceTrack : std::uint8_t { kIo, kCopies, kCompute, kOptimizer };

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;

  struct Event {
    TraceTrack track;
    std::string name;
    Clock::time_point start;
    Clock::time_point end;
  };

  explicit Tracer(std::size_t max_events = 1'000'000);

  void record(TraceTrack track, std::string name, Clock::time_point start, Clock::time_point end);
  // Writes the trace; throws std::system_error naming the path when it cannot.
  void write_chrome_json(const std::filesystem::path& path) const;
  std::size_t event_count() const;
  // A copy of the events kept, in the order they were recorded (tests read the timeline).
  std::vector<Event> events() const;

  // Records [construction, destruction) on `track`; a null tracer records nothing.
  class Scope {
   public:
    Scope(Tracer* tracer, TraceTrack track, std::string name)
        : tracer_(tracer),
          track_(track),
          name_(tracer ? std::move(name) : std::string()),
          start_(tracer ? Clock::now() : Clock::time_point()) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
      if (tracer_ != nullptr) tracer_->record(track_, std::move(name_), start_, Clock::now());
    }

   private:
    Tracer* tracer_;
    TraceTrack track_;
    std::string name_;
    Clock::time_point start_;
  };

 private:
  const std::size_t max_events_;
  const Clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

}  // namespace strata::runtime
