// universal_checkpoint_info's merge rules, parsed. Contract: tp_rules.h.
#include "src/format/deepspeed/tp_rules.h"

#include <cstdlib>

#include "fc/codec/pickle_access.h"
#include "src/format/deepspeed/state_values.h"

namespace fc::deepspeed_internal {

Result<TpRules> ParseTpRules(const PtFile& model, const PV* info) {
  TpRules rules;
  TpRules* rules_out = &rules;
  rules.source = model.name;
  auto patterns = [&](const char* key, TpRules::Patterns* out) -> Status {
    const PV* v = info->Find(key);
    if (v == nullptr || v->is_none()) return Status::Ok();
    const auto* items = PickleListItems(v);
    if (items == nullptr) {
      return DataLossError(model.name + ": universal_checkpoint_info['" + key + "'] is " +
                           v->DebugString() + ", expected a list of patterns");
    }
    for (const auto& i : *items) {
      const PV* pat = i.get();
      // parameter_with_sub_params lists SubparamShape(patterns, shape, partition_dim).
      if (std::string(key) == "parameter_with_sub_params") {
        const PV* fields = PickleDictEntries(pat) ? pat : pat->state.get();
        const auto* sub = PickleListItems(fields ? fields->Find("patterns") : nullptr);
        const std::string where = model.name + ": universal_checkpoint_info['" + key +
                                  "'] entry " + pat->DebugString();
        if (sub == nullptr) return DataLossError(where + " has no patterns list");
        SubParamRule rule;
        for (const auto& sp : *sub) {
          auto text = PickleStr(sp.get());
          if (!text) return DataLossError(model.name + ": sub-param pattern " + sp->DebugString());
          out->push_back(std::make_unique<re2::RE2>(*text, re2::RE2::Quiet));
          rule.patterns.push_back(*text);
          rule.compiled.push_back(std::make_unique<re2::RE2>(*text, re2::RE2::Quiet));
        }
        const auto* dims = PickleListItems(fields->Find("shape"));
        auto pd = IntOf(fields->Find("partition_dim"));
        if (dims == nullptr || dims->empty() || !pd || *pd < 0 ||
            static_cast<size_t>(*pd) >= dims->size()) {
          return DataLossError(where + ": shape must be a non-empty tuple and partition_dim " +
                               "one of its dims");
        }
        rule.partition_dim = static_cast<size_t>(*pd);
        if (dims->size() > kMaxSubParamEntries) return DataLossError(where + ": shape too long");
        for (const auto& d : *dims) {
          std::vector<int64_t> sizes;
          if (auto n = IntOf(d.get())) {
            if (*n < -1 || *n > kMaxSubParamSize) {
              return DataLossError(where + ": shape entry " + d->DebugString());
            }
            sizes.push_back(*n);
            rule.tuple.push_back(false);
          } else if (const auto* parts = PickleListItems(d.get())) {
            if (parts->size() > kMaxSubParamEntries) {
              return DataLossError(where + ": too many sub-params");
            }
            for (const auto& x : *parts) {
              auto n2 = IntOf(x.get());
              if (!n2 || *n2 < 0 || *n2 > kMaxSubParamSize) {
                return DataLossError(where + ": sub-param size " + x->DebugString());
              }
              sizes.push_back(*n2);
            }
            rule.tuple.push_back(true);
          } else {
            return DataLossError(where + ": shape entry " + d->DebugString());
          }
          rule.dims.push_back(std::move(sizes));
        }
        rules_out->sub_param_rules.push_back(std::move(rule));
        continue;
      }
      auto text = PickleStr(pat);
      if (!text) {
        return DataLossError(model.name + ": universal_checkpoint_info['" + key +
                             "'] entry " + pat->DebugString() + " is not a string");
      }
      out->push_back(std::make_unique<re2::RE2>(*text, re2::RE2::Quiet));
    }
    for (const auto& p : *out) {
      if (!p->ok()) {
        return UnimplementedError(model.name + ": universal_checkpoint_info['" + key +
                                  "'] pattern '" + p->pattern() + "' is not a regular " +
                                  "expression fc runs (" + p->error() + ")");
      }
    }
    return Status::Ok();
  };
  FC_RETURN_IF_ERROR(patterns("tp_replicated_parameter_patterns", &rules.replicated));
  FC_RETURN_IF_ERROR(patterns("parameter_to_average_patterns", &rules.average));
  FC_RETURN_IF_ERROR(patterns("parameter_with_2_sub_params_cat_dim_0", &rules.two_sub_params));
  FC_RETURN_IF_ERROR(patterns("parameter_with_sub_params", &rules.sub_params));
  FC_RETURN_IF_ERROR(patterns("parameter_with_row_parallelism_patterns", &rules.row_parallel));
  FC_RETURN_IF_ERROR(patterns("vocabulary_parameter_patterns", &rules.vocabulary));
  if (const PV* v = info->Find("universal_checkpoint_version"); v && !v->is_none()) {
    if (v->kind == PV::Kind::kFloat) rules.version = v->float_value;
    else if (auto n = IntOf(v)) rules.version = static_cast<double>(*n);
    else if (auto t = PickleStr(v)) rules.version = std::strtod(t->c_str(), nullptr);
  }
  if (const PV* v = info->Find("sub_param_shard_widths"); v && !v->is_none()) {
    const PickleEntries* e = PickleDictEntries(v);
    if (e == nullptr) {
      return DataLossError(model.name + ": universal_checkpoint_info['sub_param_shard_widths'] is " +
                           v->DebugString() + ", expected a dict pattern -> widths");
    }
    for (const auto& [k, w] : *e) {
      auto pattern = PickleStr(k.get());
      const auto* subs = PickleListItems(w.get());
      std::vector<std::vector<int64_t>> table;
      bool ok = pattern.has_value() && subs != nullptr && subs->size() <= kMaxSubParamEntries;
      for (size_t s = 0; ok && s < subs->size(); ++s) {
        const auto* ranks = PickleListItems((*subs)[s].get());
        if (ranks == nullptr || ranks->size() > kMaxSubParamEntries) { ok = false; break; }
        std::vector<int64_t> row;
        for (const auto& r : *ranks) {
          auto n = IntOf(r.get());
          if (!n || *n < 0 || *n > kMaxSubParamSize) { ok = false; break; }
          row.push_back(*n);
        }
        table.push_back(std::move(row));
      }
      if (!ok) {
        return DataLossError(model.name + ": universal_checkpoint_info['sub_param_shard_widths'] "
                             "entry " + k->DebugString() + ": " + w->DebugString() +
                             " is not pattern: [[width per TP rank] per sub-param]");
      }
      rules.shard_widths[*pattern] = std::move(table);
    }
  }
  if (const PV* v = info->Find("original_vocab_size"); v && !v->is_none()) {
    auto n = IntOf(v);
    if (!n || *n < 0) {
      return DataLossError(model.name + ": universal_checkpoint_info['original_vocab_size'] is " +
                           v->DebugString());
    }
    rules.original_vocab_size = n;
  }
  if (const PV* v = info->Find("autotp_unsupported_parameter_patterns"); v && !v->is_none()) {
    const PickleEntries* e = PickleDictEntries(v);
    if (e != nullptr && !e->empty()) {
      return UnimplementedError(model.name + ": universal_checkpoint_info lists "
                                "autotp_unsupported_parameter_patterns " + v->DebugString() +
                                " (DeepSpeed refuses to merge this checkpoint too)");
    }
  }
  return rules;
}

}  // namespace fc::deepspeed_internal
