// Anonymous memory for I/O buffers, backed by transparent huge pages where the kernel allows.
//
// Why: an O_DIRECT request reaches the device as one scatter-gather segment per run of physically
// contiguous memory. Over 4 KiB pages a 1 MiB buffer is ~256 segments, more than a virtio or NVMe
// queue takes in one request (max_segments, 254 on virtio-blk), so the block layer cuts every
// 1 MiB piece in two and the device sees 8 KiB-scattered transfers; a 2 MiB huge page is one
// segment, and requests merge up to max_sectors_kb. Measured on a virtio disk: 1 MiB qd16 reads
// went from ~2 to ~0.25 device requests per MiB and from 0.6x to >= 1x fio's registered-buffer
// throughput (docs/io.md). Where transparent huge pages are off (`never`) the memory is ordinary.
#pragma once

#include <cstddef>

namespace strata::io {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// Maps `length_bytes` (> 0) of zeroed, private anonymous memory aligned to kHugePageBytes and asks
// for huge pages (MADV_HUGEPAGE). Pages are not faulted in: touch, mlock or populate them. Throws
// std::bad_alloc when the kernel has no address space. Release with unmap_huge_page_backed.
std::byte* map_huge_page_backed(std::size_t length_bytes);
void unmap_huge_page_backed(std::byte* data, std::size_t length_bytes) noexcept;

// Faults every page of [data, data + length_bytes) in now, writable (MADV_POPULATE_WRITE, else by
// touching one byte per page): no page fault on the I/O path later.
void populate(std::byte* data, std::size_t length_bytes) noexcept;

}  // namespace strata::io
