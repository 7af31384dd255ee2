// rigbench's stand-in for the one PyTorch header vLLM's Marlin templates include
// (core/scalar_type.hpp: STD_TORCH_CHECK). Built by scripts/build-marlin.sh without PyTorch.
// A failed check throws std::runtime_error naming the condition; in constant evaluation a
// failed check is a compile error, as with PyTorch's macro.
#pragma once
#include <stdexcept>

#define STD_TORCH_CHECK(cond, ...)                                               \
  do {                                                                           \
    if (!(cond)) throw std::runtime_error("check failed: " #cond);               \
  } while (0)
