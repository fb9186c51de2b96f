// The torch_ext operator library. Each op declares its schema once, in the
// TORCH_LIBRARY_FRAGMENT of its own file; this block only creates the namespace.

#include <torch/library.h>

TORCH_LIBRARY(torch_ext, m) {}
