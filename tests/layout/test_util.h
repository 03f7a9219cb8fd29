// Helpers shared by the layout tests: an independent exact-cover check (fc::CheckCover over
// every tensor's replica-0 chunks), chunk lookup, small model tensor lists, and a
// brute-force model of ZeRO-1 flattening that works element by element.
#ifndef FC_TESTS_LAYOUT_TEST_UTIL_H_
#define FC_TESTS_LAYOUT_TEST_UTIL_H_

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fc/core/box_cover.h"
#include "fc/layout/layout_rules.h"
#include "fc/layout/target_layout.h"

namespace fc::layout_testing {

inline TargetTensor T(std::string key, Shape shape) {
  return TargetTensor{std::move(key), std::nullopt, std::move(shape)};
}

inline Box B(Shape offset, Shape shape) { return Box{std::move(offset), std::move(shape)}; }

// Every tensor's replica-0 chunks cover it exactly (flat chunks decomposed into boxes).
inline void RequireExactCover(const TargetLayout& layout) {
  for (const TargetTensor& t : layout.tensors) {
    std::vector<Box> pieces;
    for (const TargetRank& r : layout.ranks) {
      for (const TargetChunk& c : r.chunks) {
        if (c.key != t.key || c.replica_id != 0) continue;
        if (!c.flat_range) {
          pieces.push_back(c.box);
          continue;
        }
        for (Box b : DecomposeFlatRange(c.box.local_shape, *c.flat_range)) {
          for (size_t a = 0; a < b.rank(); ++a) b.global_offset[a] += c.box.global_offset[a];
          pieces.push_back(b);
        }
      }
    }
    CoverReport report = CheckCover(Box::Whole(t.global_shape), pieces);
    INFO("tensor " << t.key << ": covered " << report.covered_elements << " of "
                   << report.whole_elements << ", overlaps " << report.overlap_count);
    REQUIRE(report.exact());
  }
}

// The chunk of `key` on `rank`, or nullptr. Requires at most one.
inline const TargetChunk* Find(const TargetLayout& layout, int64_t rank, const std::string& key) {
  const TargetChunk* found = nullptr;
  for (const TargetRank& r : layout.ranks) {
    if (r.rank != rank) continue;
    for (const TargetChunk& c : r.chunks) {
      if (c.key != key) continue;
      REQUIRE(found == nullptr);
      found = &c;
    }
  }
  return found;
}

// A Megatron-core GPT with `layers` layers, hidden h, vocab v, ffn f.
inline std::vector<TargetTensor> MegatronModel(int layers, int64_t h, int64_t v, int64_t f) {
  std::vector<TargetTensor> out = {T("embedding.word_embeddings.weight", {v, h})};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    out.push_back(T(p + "self_attention.linear_qkv.layer_norm_weight", {h}));
    out.push_back(T(p + "self_attention.linear_qkv.weight", {3 * h, h}));
    out.push_back(T(p + "self_attention.linear_qkv.bias", {3 * h}));
    out.push_back(T(p + "self_attention.linear_proj.weight", {h, h}));
    out.push_back(T(p + "self_attention.linear_proj.bias", {h}));
    out.push_back(T(p + "mlp.linear_fc1.layer_norm_weight", {h}));
    out.push_back(T(p + "mlp.linear_fc1.weight", {f, h}));
    out.push_back(T(p + "mlp.linear_fc2.weight", {h, f}));
  }
  out.push_back(T("decoder.final_layernorm.weight", {h}));
  out.push_back(T("output_layer.weight", {v, h}));
  return out;
}

// A HuggingFace Llama with `layers` layers.
inline std::vector<TargetTensor> LlamaModel(int layers, int64_t h, int64_t kv, int64_t v,
                                            int64_t f) {
  std::vector<TargetTensor> out = {T("model.embed_tokens.weight", {v, h})};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back(T(p + "input_layernorm.weight", {h}));
    out.push_back(T(p + "self_attn.q_proj.weight", {h, h}));
    out.push_back(T(p + "self_attn.k_proj.weight", {kv, h}));
    out.push_back(T(p + "self_attn.v_proj.weight", {kv, h}));
    out.push_back(T(p + "self_attn.o_proj.weight", {h, h}));
    out.push_back(T(p + "post_attention_layernorm.weight", {h}));
    out.push_back(T(p + "mlp.gate_proj.weight", {f, h}));
    out.push_back(T(p + "mlp.up_proj.weight", {f, h}));
    out.push_back(T(p + "mlp.down_proj.weight", {h, f}));
  }
  out.push_back(T("model.norm.weight", {h}));
  out.push_back(T("lm_head.weight", {v, h}));
  return out;
}

// Brute-force ZeRO-1 for one bucket, element by element: lay the parameters out one element
// at a time (padding cells before each parameter up to `align`), cut the buffer into
// `members` parts of ceil(total/members) rounded up to `partition_align`, and collect which
// elements of which parameter each member owns. Returns (member, parameter) -> [lo, hi)
// relative to the parameter's block, checking that each such set is contiguous.
inline std::map<std::pair<int64_t, size_t>, std::pair<int64_t, int64_t>> NaiveZero(
    const std::vector<int64_t>& sizes, int64_t align, int64_t partition_align,
    int64_t members) {
  std::vector<std::pair<int64_t, int64_t>> cells;  // (parameter or -1, element)
  for (size_t q = 0; q < sizes.size(); ++q) {
    while (cells.size() % static_cast<size_t>(align) != 0) cells.push_back({-1, 0});
    for (int64_t e = 0; e < sizes[q]; ++e) cells.push_back({static_cast<int64_t>(q), e});
  }
  const int64_t total = static_cast<int64_t>(cells.size());
  int64_t part = (total + members - 1) / members;
  while (part % partition_align != 0) ++part;
  std::map<std::pair<int64_t, size_t>, std::pair<int64_t, int64_t>> out;
  for (int64_t j = 0; j < members; ++j) {
    std::map<size_t, std::vector<int64_t>> owned;
    for (int64_t pos = j * part; pos < std::min(total, (j + 1) * part); ++pos) {
      if (cells[static_cast<size_t>(pos)].first < 0) continue;
      owned[static_cast<size_t>(cells[static_cast<size_t>(pos)].first)].push_back(
          cells[static_cast<size_t>(pos)].second);
    }
    for (auto& [q, elems] : owned) {
      for (size_t k = 1; k < elems.size(); ++k) REQUIRE(elems[k] == elems[k - 1] + 1);
      out[{j, q}] = {elems.front(), elems.back() + 1};
    }
  }
  return out;
}

}  // namespace fc::layout_testing

#endif  // FC_TESTS_LAYOUT_TEST_UTIL_H_
