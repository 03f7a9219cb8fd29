// Re-emitting a parsed pickle (fc/codec/pickle.h PickleValue) with PickleWriter, for the
// writers that carry a file's pickled structure over with some values changed (DeepSpeed
// model and optimizer states at another DP size, UCP files).
//
// Protocol-2 opcodes as CPython's pickler writes them for the kinds handled: None, bool,
// int, float, str, tuple, list, dict, set/frozenset (set(list) reduce), bytes held inline
// (_codecs.encode(latin-1 text, 'latin1')), globals, REDUCE calls and NEWOBJ objects with
// their BUILD state and list items / dict entries set after construction. Memoized where
// CPython memoizes (strings, tuples, lists, dicts, reduce results), so the output is an
// ordinary protocol-2 pickle; shared sub-values are written once per reference.
// Errors: kUnimplemented naming `where` and the value for what it cannot write (persistent
// ids, big ints, bytes whose payload is not inline) unless the hook writes them;
// kResourceExhausted once the writer holds more than kMaxReemitBytes (a value shared many
// times over expands: n nested pairs [x, x] are 2^n values written out).
//
// Thread-safety: none (as the writer).
#ifndef FC_CODEC_PICKLE_REEMIT_H_
#define FC_CODEC_PICKLE_REEMIT_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "fc/codec/pickle.h"
#include "fc/codec/pickle_writer.h"
#include "fc/core/status.h"

namespace fc {

// Most bytes EmitPickleValue writes into one writer (see Errors above).
inline constexpr size_t kMaxReemitBytes = size_t{256} << 20;

// Asked first for every node: returns a status when it wrote the node itself (e.g. a tensor
// as a persistent id), nullopt for the default handling.
using PickleEmitHook = std::function<std::optional<Status>(internal_torch::PickleWriter&,
                                                           const PickleValue&)>;

Status EmitPickleValue(internal_torch::PickleWriter& w, const PickleValue& v,
                       const std::string& where, const PickleEmitHook& hook = {});

}  // namespace fc

#endif  // FC_CODEC_PICKLE_REEMIT_H_
