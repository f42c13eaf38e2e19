// torch's CPU allocator over the shared arena (core/shm/shared_arena.h), for
// TORCH_DDL_SHARED_ALLOCATOR=1: allocations of at least TORCH_DDL_DIRECT_MIN_BYTES come from
// memory the ranks of one host map, so that their allreduces take the direct path at once;
// smaller ones, and those the arena does not serve, go to the allocator it replaced.
#pragma once

#include <cstddef>

namespace ddl {

// Installs it (once; later calls change nothing). False when the setting is 0.
bool installSharedAllocatorIfAsked();
// Whether it is installed, and the smallest allocation it serves.
bool sharedAllocatorInstalled(size_t* minBytes);

}  // namespace ddl
