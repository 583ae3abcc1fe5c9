// Device base: budget accounting, poison quarantine, argument checks shared by every backend.
#include "tiers/device/device.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <iterator>
#include <vector>

#include "base/assert.hpp"
#include "base/units.hpp"
#include "cpu_adam/norm_shape.hpp"
#include "tiers/device/host_device.hpp"
#if defined(STRATA_HAVE_CUDA)
#include "tiers/device/cuda_device.hpp"
#endif

namespace strata::tiers {

namespace {

bool aligned_to(const void* pointer, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(pointer) % alignment == 0;
}

}  // namespace

std::string_view device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kHost:
      return "host";
    case DeviceKind::kCuda:
      return "cuda";
    case DeviceKind::kAuto:
      return "auto";
  }
  return "?";
}

DeviceBudgetError::DeviceBudgetError(const std::string& device_name, std::uint64_t budget_bytes,
                                     std::uint64_t in_use_bytes, std::uint64_t requested_bytes)
    : std::runtime_error(fmt::format(
          "device {}: allocating {} bytes would exceed the device budget of {} bytes ({} bytes "
          "in use)",
          device_name, requested_bytes, budget_bytes, in_use_bytes)),
      budget_bytes_(budget_bytes),
      in_use_bytes_(in_use_bytes),
      requested_bytes_(requested_bytes) {}

DeviceSpan DeviceSpan::subspan(std::uint64_t offset_bytes, std::uint64_t length_bytes) const {
  STRATA_ASSERT(offset_bytes <= bytes && length_bytes <= bytes - offset_bytes,
                "subspan out of range");
  return {data + offset_bytes, length_bytes};
}

// ---- DeviceBuffer ---------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (device_ != nullptr) {
    device_->release(data_, bytes_);
  }
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

// ---- Device ---------------------------------------------------------------------------------

Device::Device(DeviceKind kind, DeviceOptions options, std::string name)
    : options_(options), name_(std::move(name)), kind_(kind) {
  STRATA_ASSERT(kind != DeviceKind::kAuto);
  poison_ = poison_enabled(options_.poison);
}

Device::~Device() {
  // Outliving everything it created is the caller's contract; a leak here means a dangling handle.
  STRATA_ASSERT(live_buffers_ == 0, "a DeviceBuffer outlived its Device");
  STRATA_ASSERT(live_streams_ == 0, "a Stream outlived its Device");
  STRATA_ASSERT(live_events_ == 0, "an Event outlived its Device");
  STRATA_ASSERT(quarantine_.empty() && pool_.empty(),
                "derived Device must call release_quarantine()");
}

DeviceBuffer Device::allocate(std::uint64_t bytes) {
  if (bytes == 0) {
    return {};
  }
  const std::uint64_t accounted = round_up(bytes, kDeviceAllocationGranularity);
  std::byte* data = nullptr;
  std::vector<std::pair<std::byte*, std::uint64_t>> to_free;
  {
    std::lock_guard lock(mutex_);
    if (accounted > options_.budget_bytes - in_use_bytes_) {
      throw DeviceBudgetError(name_, options_.budget_bytes, in_use_bytes_, bytes);
    }
    data = take_pooled_locked(accounted);
    if (data == nullptr) {
      make_room_locked(accounted, to_free);
      ++backend_allocations_;
    }
    in_use_bytes_ += accounted;
    high_water_bytes_ = std::max(high_water_bytes_, in_use_bytes_);
    ++live_buffers_;
  }
  free_blocks(to_free);
  if (data == nullptr) {
    try {
      data = allocate_raw(accounted);
    } catch (...) {
      std::lock_guard lock(mutex_);
      in_use_bytes_ -= accounted;
      --live_buffers_;
      throw;
    }
  }
  STRATA_ASSERT(aligned_to(data, kDeviceAlignment), "backend returned a misaligned buffer");
  return DeviceBuffer(this, data, bytes);
}

std::byte* Device::take_pooled_locked(std::uint64_t accounted) {
  const auto block = pool_.find(accounted);
  if (block == pool_.end()) return nullptr;
  std::byte* data = block->second;
  pool_.erase(block);
  pooled_bytes_ -= accounted;
  return data;
}

// Frees pooled blocks, largest first, until `accounted` more bytes fit beside the bytes in use, the
// pool and the quarantine: the backend never holds more than the budget.
void Device::make_room_locked(std::uint64_t accounted,
                              std::vector<std::pair<std::byte*, std::uint64_t>>& to_free) {
  while (!pool_.empty() &&
         in_use_bytes_ + pooled_bytes_ + quarantine_bytes_ + accounted > options_.budget_bytes) {
    const auto largest = std::prev(pool_.end());
    to_free.emplace_back(largest->second, largest->first);
    pooled_bytes_ -= largest->first;
    pool_.erase(largest);
  }
}

void Device::free_blocks(const std::vector<std::pair<std::byte*, std::uint64_t>>& blocks) noexcept {
  for (const auto& [pointer, length] : blocks) {
    free_raw(pointer, length);
  }
  if (!blocks.empty()) {
    std::lock_guard lock(mutex_);
    backend_frees_ += blocks.size();
  }
}

void Device::release(std::byte* data, std::uint64_t bytes) noexcept {
  const std::uint64_t accounted = round_up(bytes, kDeviceAllocationGranularity);
  if (poison_) {
    poison_raw(data, accounted);
  }
  std::lock_guard lock(mutex_);
  STRATA_ASSERT(in_use_bytes_ >= accounted && live_buffers_ > 0, "device budget underflow");
  in_use_bytes_ -= accounted;
  --live_buffers_;
  if (!poison_) {
    pool_.emplace(accounted, data);
    pooled_bytes_ += accounted;
    return;
  }
  // Poisoned blocks wait in the quarantine (never reused while there) and then join the pool.
  quarantine_.emplace_back(data, accounted);
  quarantine_bytes_ += accounted;
  while (quarantine_bytes_ > options_.poison_quarantine_bytes) {
    const auto [oldest, length] = quarantine_.front();
    quarantine_.pop_front();
    quarantine_bytes_ -= length;
    pool_.emplace(length, oldest);
    pooled_bytes_ += length;
  }
}

void Device::release_quarantine() noexcept {
  std::vector<std::pair<std::byte*, std::uint64_t>> to_free;
  {
    std::lock_guard lock(mutex_);
    to_free.assign(quarantine_.begin(), quarantine_.end());
    quarantine_.clear();
    quarantine_bytes_ = 0;
  }
  free_blocks(to_free);
  release_pool();
}

void Device::release_pool() noexcept {
  std::vector<std::pair<std::byte*, std::uint64_t>> to_free;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [length, pointer] : pool_) to_free.emplace_back(pointer, length);
    pool_.clear();
    pooled_bytes_ = 0;
  }
  free_blocks(to_free);
}

std::uint64_t Device::pooled_bytes() const {
  std::lock_guard lock(mutex_);
  return pooled_bytes_;
}

std::uint64_t Device::backend_allocation_count() const {
  std::lock_guard lock(mutex_);
  return backend_allocations_;
}

std::uint64_t Device::backend_free_count() const {
  std::lock_guard lock(mutex_);
  return backend_frees_;
}

std::uint64_t Device::in_use_bytes() const {
  std::lock_guard lock(mutex_);
  return in_use_bytes_;
}

std::uint64_t Device::high_water_bytes() const {
  std::lock_guard lock(mutex_);
  return high_water_bytes_;
}

std::uint64_t Device::live_buffer_count() const {
  std::lock_guard lock(mutex_);
  return live_buffers_;
}

// ---- Event ----------------------------------------------------------------------------------

Event::Event(Device& device, std::unique_ptr<detail::EventImpl> impl)
    : device_(&device), impl_(std::move(impl)) {
  std::lock_guard lock(device_->mutex_);
  ++device_->live_events_;
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    impl_ = std::move(other.impl_);
  }
  return *this;
}

void Event::reset() noexcept {
  if (impl_) {
    impl_.reset();
    std::lock_guard lock(device_->mutex_);
    --device_->live_events_;
  }
}

// ---- Stream ---------------------------------------------------------------------------------

void detail::report_uncollected_error(const char* stream_kind,
                                      const std::exception_ptr& error) noexcept {
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: %s stream destroyed with an unreported error: %s\n", stream_kind,
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "strata: %s stream destroyed with an unreported error\n", stream_kind);
  }
}

Stream::Stream(Device& device, std::unique_ptr<detail::StreamImpl> impl)
    : device_(&device), impl_(std::move(impl)) {
  std::lock_guard lock(device_->mutex_);
  ++device_->live_streams_;
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    impl_ = std::move(other.impl_);
  }
  return *this;
}

void Stream::reset() noexcept {
  if (impl_) {
    impl_.reset();  // drains the queue
    std::lock_guard lock(device_->mutex_);
    --device_->live_streams_;
  }
}

void Stream::copy_to_device(DeviceSpan dst, const void* host_src) {
  STRATA_ASSERT(host_src != nullptr || dst.bytes == 0);
  submit(CopyOp{CopyDirection::kHostToDevice, dst.data, host_src, dst.bytes});
}

void Stream::copy_to_host(void* host_dst, DeviceSpan src) {
  STRATA_ASSERT(host_dst != nullptr || src.bytes == 0);
  submit(CopyOp{CopyDirection::kDeviceToHost, host_dst, src.data, src.bytes});
}

void Stream::copy_on_device(DeviceSpan dst, DeviceSpan src) {
  STRATA_ASSERT(dst.bytes == src.bytes, "device-to-device copy needs equal lengths");
  submit(CopyOp{CopyDirection::kDeviceToDevice, dst.data, src.data, src.bytes});
}

void Stream::cast(DeviceSpan dst, DType dst_type, DeviceSpan src, DType src_type) {
  STRATA_ASSERT(is_floating_point(dst_type) && is_floating_point(src_type),
                "cast takes fp32, bf16 or fp16");
  STRATA_ASSERT(src.bytes % dtype_bytes(src_type) == 0, "cast source is not whole elements");
  const std::uint64_t count = src.bytes / dtype_bytes(src_type);
  STRATA_ASSERT(dst.bytes == count * dtype_bytes(dst_type), "cast lengths disagree");
  STRATA_ASSERT(src_type == dst_type || src_type == DType::kFp32 || dst_type == DType::kFp32,
                "cast between two 16-bit types is not supported");
  STRATA_ASSERT(aligned_to(dst.data, dtype_bytes(dst_type)) &&
                aligned_to(src.data, dtype_bytes(src_type)));
  submit(CastOp{dst.data, dst_type, src.data, src_type, count});
}

void Stream::scale(DeviceSpan data_fp32, float factor) {
  STRATA_ASSERT(data_fp32.bytes % 4 == 0 && aligned_to(data_fp32.data, 4));
  submit(ScaleOp{data_fp32.as<float>(), data_fp32.bytes / 4, factor});
}

void Stream::fill(DeviceSpan data_fp32, float value) {
  STRATA_ASSERT(data_fp32.bytes % 4 == 0 && aligned_to(data_fp32.data, 4));
  submit(FillOp{data_fp32.as<float>(), data_fp32.bytes / 4, value});
}

void Stream::fill_bytes(DeviceSpan data, std::uint8_t value) {
  submit(FillBytesOp{data.data, data.bytes, value});
}

void Stream::accumulate(DeviceSpan dst_fp32, DeviceSpan src, DType src_type) {
  STRATA_ASSERT(is_floating_point(src_type), "accumulate takes fp32, bf16 or fp16");
  STRATA_ASSERT(dst_fp32.bytes % 4 == 0 && aligned_to(dst_fp32.data, 4));
  const std::uint64_t count = dst_fp32.bytes / 4;
  STRATA_ASSERT(src.bytes == count * dtype_bytes(src_type), "accumulate lengths disagree");
  STRATA_ASSERT(aligned_to(src.data, dtype_bytes(src_type)));
  submit(AccumulateOp{dst_fp32.as<float>(), src.data, src_type, count});
}

void Stream::optimizer_update(const OptimizerOp& op) {
  using cpu_adam::StateDType;
  const bool bf16_master = op.master_dtype == StateDType::kBf16;
  STRATA_ASSERT(op.master_dtype == StateDType::kFp32 || bf16_master,
                "optimizer master weights must be fp32 or bf16");
  STRATA_ASSERT(op.compensation == nullptr || bf16_master, "a compensation needs a bf16 master");
  STRATA_ASSERT(is_floating_point(op.grad_dtype), "optimizer gradients are fp32, bf16 or fp16");
  STRATA_ASSERT(op.param_out == nullptr || op.param_out_dtype == DType::kBf16 ||
                    op.param_out_dtype == DType::kFp16,
                "optimizer param_out must be bf16 or fp16");
  STRATA_ASSERT(op.decay_run_count == 0 || op.decay_runs != nullptr, "decay runs missing");
  const bool uses_exp_avg = cpu_adam::rule_uses_exp_avg(op.plan.rule);
  const bool uses_exp_avg_sq = cpu_adam::rule_uses_exp_avg_sq(op.plan.rule);
  if (op.numel != 0) {
    STRATA_ASSERT(op.master != nullptr && op.grad != nullptr, "optimizer master or grad missing");
    STRATA_ASSERT(!uses_exp_avg || op.exp_avg != nullptr, "optimizer exp_avg missing");
    STRATA_ASSERT(!uses_exp_avg_sq || op.exp_avg_sq != nullptr, "optimizer exp_avg_sq missing");
  }
  const std::size_t moment_alignment = op.moment_dtype == StateDType::kBf16 ? 2 : 4;
  STRATA_ASSERT(aligned_to(op.master, bf16_master ? 2 : 4) && aligned_to(op.compensation, 2) &&
                    aligned_to(op.exp_avg, moment_alignment) &&
                    aligned_to(op.exp_avg_sq, moment_alignment) &&
                    aligned_to(op.grad, dtype_bytes(op.grad_dtype)) && aligned_to(op.param_out, 2),
                "optimizer array misaligned for its element type");
  submit(op);
}

void Stream::sum_of_squares(DeviceSpan src, DType src_type, DeviceSpan sum_fp64,
                            DeviceSpan scratch) {
  STRATA_ASSERT(is_floating_point(src_type), "sum of squares takes fp32, bf16 or fp16");
  STRATA_ASSERT(
      src.bytes % dtype_bytes(src_type) == 0 && aligned_to(src.data, dtype_bytes(src_type)),
      "sum of squares source is not whole aligned elements");
  STRATA_ASSERT(sum_fp64.bytes == sizeof(double) && aligned_to(sum_fp64.data, sizeof(double)),
                "sum of squares needs one aligned double");
  const std::uint64_t count = src.bytes / dtype_bytes(src_type);
  STRATA_ASSERT(scratch.bytes >= sum_of_squares_scratch_bytes(count) &&
                    aligned_to(scratch.data, sizeof(double)),
                "sum of squares scratch too small or misaligned");
  submit(SumOfSquaresOp{src.data, src_type, count, sum_fp64.as<double>(), scratch.as<double>()});
}

void Stream::host_callback(std::function<void()> function) {
  STRATA_ASSERT(static_cast<bool>(function));
  submit(HostCallbackOp{std::move(function)});
}

void Stream::submit(DeviceOp op) {
  STRATA_ASSERT(impl_ != nullptr, "use of a moved-from Stream");
  impl_->submit(std::move(op));
}

void Stream::record(Event& event) {
  impl_->record(event.impl());
}

void Stream::wait(Event& event) {
  impl_->wait(event.impl());
}

void Stream::synchronize() {
  impl_->synchronize();
}

std::uint64_t sum_of_squares_scratch_bytes(std::uint64_t count) {
  return (count + cpu_adam::kNormBlockElems - 1) / cpu_adam::kNormBlockElems * sizeof(double);
}

// ---- factory --------------------------------------------------------------------------------

std::string cuda_unavailable_reason() {
#if defined(STRATA_HAVE_CUDA)
  return detail::cuda_unavailable_reason();
#else
  return "strata was built without CUDA (STRATA_CUDA=OFF or no CUDA toolkit found)";
#endif
}

int cuda_device_count() {
#if defined(STRATA_HAVE_CUDA)
  return detail::cuda_device_count();
#else
  return 0;
#endif
}

std::unique_ptr<Device> make_device(const DeviceOptions& options) {
  DeviceKind kind = options.kind;
  if (kind == DeviceKind::kAuto) {
    kind = cuda_unavailable_reason().empty() ? DeviceKind::kCuda : DeviceKind::kHost;
  }
  if (kind == DeviceKind::kCuda) {
#if defined(STRATA_HAVE_CUDA)
    return std::make_unique<CudaDevice>(options);
#else
    throw std::runtime_error("make_device: a CUDA device was asked for but " +
                             cuda_unavailable_reason());
#endif
  }
  return std::make_unique<HostDevice>(options);
}

}  // namespace strata::tiers
