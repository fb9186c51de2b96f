#include "guard/collective/IssuedWords.h"

#include "guard/collective/CallSite.h"
#include "guard/collective/LabelTable.h"

namespace torch_ext {

OpWords issuedWords(const Fingerprint& fp, uint32_t callSite, uint32_t label, uint64_t hash) {
  OpWords words;
  words.facts = fp.facts();
  words.text = words.facts.text;
  const Label l = LabelTable::instance().get(label);
  const std::vector<Frame> frames = CallSites::instance().frames(callSite);
  words.where = describeCallSite(frames) + labelSuffix(l, frames);
  words.caller = describeCaller(frames);
  words.hint = l.hint;
  words.hash = hash;
  return words;
}

}  // namespace torch_ext
