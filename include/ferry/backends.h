// The built-in backends of this build, listed explicitly.
#pragma once

namespace ferry {

// Registers the registries compiled into this build (the CPU always; CUDA when built with it),
// once per process; later calls do nothing. Call it before looking up devices: the `ferry`
// tool, the tests and the benchmarks do so first thing. Remote registries are added when a
// connection is made (remote::connect).
void init_backends();

}  // namespace ferry
