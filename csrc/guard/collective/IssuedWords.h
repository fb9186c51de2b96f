#pragma once

// IssuedWords: the OpWords (report/OpWords.h) of an operation this rank
// issued, made in one place from what the pipeline recorded: its fingerprint
// (text, facts, hash), its call site (where, and the line that called it) and
// the label active when it was issued (the label's suffix and hint).

#include "guard/collective/Fingerprint.h"
#include "guard/report/OpWords.h"

#include <cstdint>

namespace torch_ext {

// `hash`: what the channel compares (the fingerprint's hash for a collective,
// its pair hash for a send's print).
OpWords issuedWords(const Fingerprint& fp, uint32_t callSite, uint32_t label, uint64_t hash);

}  // namespace torch_ext
