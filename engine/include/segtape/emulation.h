// Test seams. Not for production use.
#pragma once

namespace segtape::emulation {

// While on, every new Tape(Device::cuda(i)) gets a host-emulated device
// instead of the CUDA backend (also in a build without CUDA): its pools are
// host memory the host may not touch directly (data<T>() raises, as on a
// GPU), copies, fills and parameter updates go through the backend
// interface, and the ops compute with the CPU code. It lets the CPU-only CI
// run the device code paths of the tape, nn and the agent (the device
// tests, built a second time against it). It is not a model of a
// GPU's numerics or streams. With TapeOptions::graph_replay it keeps the
// CUDA backend's graph schedule (engine/graph_schedule.h): calls are signed,
// captured and checked against the capture, and what a graph segment cannot
// do is refused, but every call runs when it is issued (no graph is made).
void emulate_cuda_on_host(bool on);
bool emulating_cuda_on_host();

}  // namespace segtape::emulation
