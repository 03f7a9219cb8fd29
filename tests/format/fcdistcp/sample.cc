#include "tests/format/fcdistcp/sample.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "fc/core/dtype_convert.h"
#include "fc/core/flat_range.h"

namespace fc::fcdistcp_sample {

FcDistcpPlan SamplePlan() {
  FcDistcpPlan plan;
  plan.tensors = {
      {"model.embed.weight", DType::kFloat32, {8, 4}},
      {"model.norm.weight", DType::kBFloat16, {4}},
      {"optim.exp_avg", DType::kFloat32, {8, 4}},
      {"step_scale", DType::kFloat64, {}},
      {"empty.bias", DType::kFloat16, {0}},
  };
  plan.attributes = {{"generator", "tests/format/fcdistcp/sample.cc"},
                     {"source_format", "synthetic"}};
  FcDistcpFileSpec r0{"0_0.distcp", {}, {}};
  r0.chunks.push_back({"model.embed.weight", Box{{0, 0}, {4, 4}}, std::nullopt, 0});
  r0.chunks.push_back({"model.norm.weight", Box{{0}, {4}}, std::nullopt, 0});
  r0.chunks.push_back({"optim.exp_avg", Box{{0, 0}, {8, 4}}, FlatRange{0, 13}, 0});
  r0.chunks.push_back({"step_scale", Box{{}, {}}, std::nullopt, 0});
  r0.objects.push_back({"train.iteration", ObjectEncoding::kRaw, 8});
  FcDistcpFileSpec r1{"1_0.distcp", {}, {}};
  r1.chunks.push_back({"model.embed.weight", Box{{4, 0}, {4, 4}}, std::nullopt, 0});
  r1.chunks.push_back({"model.norm.weight", Box{{0}, {4}}, std::nullopt, 1});
  r1.chunks.push_back({"optim.exp_avg", Box{{0, 0}, {8, 4}}, FlatRange{13, 32}, 0});
  r1.chunks.push_back({"empty.bias", Box{{0}, {0}}, std::nullopt, 0});
  r1.objects.push_back({"rng_state", ObjectEncoding::kTorchSave, 37});
  plan.files = {r0, r1};
  return plan;
}

double SampleValue(const std::string& key, int64_t linear) {
  if (key == "model.embed.weight") return static_cast<double>(linear) * 0.5 - 4;
  if (key == "model.norm.weight") return 1.0 + static_cast<double>(linear);
  if (key == "optim.exp_avg") return static_cast<double>(linear) * 0.125;
  if (key == "step_scale") return 0.5;
  return static_cast<double>(linear % 7) - 3;
}

std::vector<std::byte> ChunkValues(const FcDistcpTensorSpec& tensor, const FcDistcpChunkSpec& chunk) {
  const Box& box = chunk.box;
  const int64_t box_n = box.num_elements();
  const FlatRange range = chunk.flat_range.value_or(FlatRange{0, box_n});
  std::vector<double> values;
  values.reserve(static_cast<size_t>(range.size()));
  for (int64_t k = range.inclusive_min; k < range.exclusive_max; ++k) {
    Shape local = Unravel(k, box.local_shape);
    Shape global(local.size());
    for (size_t i = 0; i < local.size(); ++i) global[i] = local[i] + box.global_offset[i];
    values.push_back(SampleValue(tensor.key, Ravel(global, tensor.global_shape)));
  }
  std::vector<std::byte> out(values.size() * DTypeSize(tensor.dtype));
  Status s = ConvertElements(values.data(), DType::kFloat64, out.data(), tensor.dtype,
                             values.size());
  (void)s;  // float64 -> any float type cannot fail
  return out;
}

std::vector<std::byte> SampleObjectBytes(const std::string& key) {
  std::vector<std::byte> out;
  if (key == "train.iteration") {
    int64_t v = 1000;
    out.resize(8);
    std::memcpy(out.data(), &v, 8);
    return out;
  }
  // A stand-in for a torch.save zip: a local-file-header magic, then bytes 0..32.
  const unsigned char magic[] = {'P', 'K', 3, 4};
  for (unsigned char c : magic) out.push_back(static_cast<std::byte>(c));
  for (int i = 0; i < 33; ++i) out.push_back(static_cast<std::byte>(i * 7 + 1));
  return out;
}

Status WriteFcDistcpSample(const std::string& out_dir) {
  const FcDistcpPlan plan = SamplePlan();
  FC_ASSIGN_OR_RETURN(std::unique_ptr<FcDistcpWriter> w, FcDistcpWriter::Create(out_dir, plan));
  std::unordered_map<std::string, const FcDistcpTensorSpec*> tensors;
  for (const auto& t : plan.tensors) tensors[t.key] = &t;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    for (size_t c = 0; c < plan.files[f].chunks.size(); ++c) {
      const FcDistcpChunkSpec& chunk = plan.files[f].chunks[c];
      std::vector<std::byte> bytes = ChunkValues(*tensors.at(chunk.key), chunk);
      // Slabs of 12 bytes; odd chunks are written back to front (out of order).
      std::vector<std::pair<size_t, size_t>> slabs;
      for (size_t off = 0; off < bytes.size(); off += 12) {
        slabs.emplace_back(off, std::min<size_t>(12, bytes.size() - off));
      }
      if (c % 2 == 1) std::reverse(slabs.begin(), slabs.end());
      for (auto [off, len] : slabs) {
        FC_RETURN_IF_ERROR(w->WriteChunk(f, c, off, std::span(bytes).subspan(off, len)));
      }
    }
    for (size_t o = 0; o < plan.files[f].objects.size(); ++o) {
      FC_RETURN_IF_ERROR(w->WriteObject(f, o, 0, SampleObjectBytes(plan.files[f].objects[o].key)));
    }
  }
  return w->Finish();
}

}  // namespace fc::fcdistcp_sample
