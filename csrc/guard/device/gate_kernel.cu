// The stream gate's kernel (the source of GateKernel.h's PTX; regenerate with
// scripts/gate_ptx.sh, which needs nvcc). Not compiled by setup.py: the
// extension builds without CUDA, and loads this PTX through the driver when a
// CUDA stream is first held (CudaGate.cpp).
//
// One block. Lane 0 of each warp polls the gate word (GateWord.h) until the
// verdict for `seq` is in, sleeping between polls; then, if the verdict is
// poison, every thread overwrites its share of the result's regions with
// their pattern. The rule is GateWord::decide, bit for bit.

struct GateRegion {
  unsigned long long ptr;    // device address of the result's bytes
  unsigned long long count;  // elements of `width` bytes
  unsigned long long bits;   // the pattern, in the low `width` bytes
  unsigned int width;        // 1, 2, 4 or 8
  unsigned int pad;
};

struct GateRegions {
  GateRegion r[4];
};

__device__ __forceinline__ unsigned long long loadWord(const unsigned long long* word) {
  unsigned long long v;
  // A relaxed load at system scope: each poll reads the host's latest write.
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(word) : "memory");
  return v;
}

extern "C" __global__ void torch_ext_stream_gate(const unsigned long long* word, unsigned long long seq, unsigned int n,
                                                 GateRegions regions) {
  // Lane 0 of each warp polls and hands the word to its warp (no block-wide
  // barrier: a barrier reached by a warp whose lane 0 still spins is not
  // allowed). Every warp reaches the same verdict: the word only moves
  // forward, and a poison never names a seq already released (GateWord.h).
  const unsigned int lane = threadIdx.x & 31;
  const unsigned long long bit = 1ull << 63;
  unsigned int sleep = 32;
  int poisoned = 0;
  for (;;) {
    unsigned long long v = lane == 0 ? loadWord(word) : 0;
    v = __shfl_sync(0xffffffffu, v, 0);
    if (v & bit) {
      poisoned = seq >= (v & ~bit);
      break;
    }
    if (v >= seq) break;
    __nanosleep(sleep);
    if (sleep < 1024) sleep *= 2;
  }
  if (!poisoned) return;
  for (unsigned int k = 0; k < n && k < 4; ++k) {
    const GateRegion& g = regions.r[k];
    for (unsigned long long i = threadIdx.x; i < g.count; i += blockDim.x) {
      switch (g.width) {
        case 1:
          reinterpret_cast<unsigned char*>(g.ptr)[i] = static_cast<unsigned char>(g.bits);
          break;
        case 2:
          reinterpret_cast<unsigned short*>(g.ptr)[i] = static_cast<unsigned short>(g.bits);
          break;
        case 4:
          reinterpret_cast<unsigned int*>(g.ptr)[i] = static_cast<unsigned int>(g.bits);
          break;
        default:
          reinterpret_cast<unsigned long long*>(g.ptr)[i] = g.bits;
          break;
      }
    }
  }
}
