// A build without CUDA: no device streams (CUDA tensors are refused with a message saying so).
#include "device_streams.hpp"

namespace ddl {

DeviceStreams* cudaStreams() { return nullptr; }

}  // namespace ddl
