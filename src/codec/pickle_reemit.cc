#include "fc/codec/pickle_reemit.h"

namespace fc {

using internal_torch::PickleWriter;
using PV = PickleValue;
using K = PickleValue::Kind;

Status EmitPickleValue(PickleWriter& w, const PV& v, const std::string& where,
                       const PickleEmitHook& hook) {
  // Shared sub-values are written once per reference, so a small hostile pickle (n nested
  // pairs [x, x]) would expand to 2^n values: the output is bounded instead.
  if (w.bytes() > kMaxReemitBytes) {
    return ResourceExhaustedError(where + ": re-pickled value passes " +
                                  std::to_string(kMaxReemitBytes >> 20) +
                                  " MiB (values shared through the memo are written once "
                                  "per reference)");
  }
  if (hook) {
    if (std::optional<Status> done = hook(w, v)) return *done;
  }
  auto items = [&](const std::vector<PV::Ptr>& list) -> Status {
    for (const PV::Ptr& item : list) FC_RETURN_IF_ERROR(EmitPickleValue(w, *item, where, hook));
    return Status::Ok();
  };
  auto entries = [&](const std::vector<std::pair<PV::Ptr, PV::Ptr>>& list) -> Status {
    for (const auto& [k, value] : list) {
      FC_RETURN_IF_ERROR(EmitPickleValue(w, *k, where, hook));
      FC_RETURN_IF_ERROR(EmitPickleValue(w, *value, where, hook));
    }
    return Status::Ok();
  };
  // BUILD state, then list items and dict entries filled in after construction.
  auto fill = [&]() -> Status {
    if (v.state) {
      FC_RETURN_IF_ERROR(EmitPickleValue(w, *v.state, where, hook));
      w.Build();
    }
    if (v.kind != K::kList && !v.items.empty()) {
      w.Mark();
      FC_RETURN_IF_ERROR(items(v.items));
      w.Appends();
    }
    if (v.kind != K::kDict && !v.entries.empty()) {
      w.Mark();
      FC_RETURN_IF_ERROR(entries(v.entries));
      w.SetItems();
    }
    return Status::Ok();
  };
  switch (v.kind) {
    case K::kNone: w.None(); return Status::Ok();
    case K::kBool: w.Bool(v.bool_value); return Status::Ok();
    case K::kInt: w.Int(v.int_value); return Status::Ok();
    case K::kFloat: w.Float(v.float_value); return Status::Ok();
    case K::kStr: w.Str(v.str).Memoize(); return Status::Ok();
    case K::kTuple:
      if (v.items.empty()) {
        w.EmptyTuple();
        return Status::Ok();
      }
      if (v.items.size() > 3) w.Mark();
      FC_RETURN_IF_ERROR(items(v.items));
      w.TupleOf(v.items.size()).Memoize();
      return Status::Ok();
    case K::kList:
      w.EmptyList().Memoize();
      if (!v.items.empty()) {
        w.Mark();
        FC_RETURN_IF_ERROR(items(v.items));
        w.Appends();
      }
      return Status::Ok();
    case K::kDict:
      w.EmptyDict().Memoize();
      if (!v.entries.empty()) {
        w.Mark();
        FC_RETURN_IF_ERROR(entries(v.entries));
        w.SetItems();
      }
      return Status::Ok();
    case K::kSet:
      // Protocol 2 (CPython's save_reduce for sets, with fix_imports): set(list).
      w.Global("__builtin__", v.bool_value ? "frozenset" : "set");
      w.EmptyList().Memoize();
      if (!v.items.empty()) {
        w.Mark();
        FC_RETURN_IF_ERROR(items(v.items));
        w.Appends();
      }
      w.TupleOf(1).Memoize();
      w.Reduce().Memoize();
      return Status::Ok();
    case K::kBytes: {
      if (v.str.size() != v.bytes_length) break;  // payload not inline
      // Protocol 2: _codecs.encode(<latin-1 text>, 'latin1').
      std::string text;
      for (unsigned char c : v.str) {
        if (c < 0x80) {
          text += static_cast<char>(c);
        } else {
          text += static_cast<char>(0xC0 | (c >> 6));
          text += static_cast<char>(0x80 | (c & 0x3F));
        }
      }
      w.Global("_codecs", "encode");
      w.Str(text).Memoize();
      w.Str("latin1").Memoize();
      w.TupleOf(2).Memoize();
      w.Reduce().Memoize();
      return Status::Ok();
    }
    case K::kGlobal: w.Global(v.str, v.name); return Status::Ok();
    case K::kCall:
      if (!v.callee || !v.args) break;
      FC_RETURN_IF_ERROR(EmitPickleValue(w, *v.callee, where, hook));
      FC_RETURN_IF_ERROR(EmitPickleValue(w, *v.args, where, hook));
      w.Reduce().Memoize();
      return fill();
    case K::kObject:
      if (!v.callee || v.kwargs) break;
      FC_RETURN_IF_ERROR(EmitPickleValue(w, *v.callee, where, hook));
      if (v.args) {
        FC_RETURN_IF_ERROR(EmitPickleValue(w, *v.args, where, hook));
      } else {
        w.EmptyTuple();
      }
      w.NewObj().Memoize();
      return fill();
    case K::kBigInt:
    case K::kPersId: break;
  }
  return UnimplementedError(where + ": cannot re-pickle the value " + v.DebugString(80) +
                            " (a " + std::string(PickleKindName(v.kind)) + ")");
}

}  // namespace fc
