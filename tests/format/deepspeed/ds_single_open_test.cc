// Issue 33, "no second open of the input": the DeepSpeed writers plan from what the reader
// parsed. A counting Env (fc/io/env.h) sees every .pt of a testdata/deepspeed checkpoint
// opened at most once over ReadDeepSpeedCheckpoint + PlanDeepSpeedRepartition(input, index,
// dp) and over ReadDeepSpeedCheckpoint + ReadUcpSource; and what they return equals what
// they return reading every file themselves (an index that kept nothing).
// Two data reads (not parses) open a file again, checked as such: the reader's comparison of
// TP-replicated tensors (TP > 1, through a ChunkReader) and ReadUcpSource's read of a ZeRO-3
// source's 0-d Adam step tensor (its bytes go into zero/optimizer_state.pt).
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fc/format/deepspeed.h"
#include "fc/format/deepspeed_writer.h"
#include "fc/format/ucp_writer.h"
#include "fc/io/env.h"
#include "tests/support/testdata.h"

namespace fc {
namespace {

std::string Normal(const std::string& path) {
  return std::filesystem::path(path).lexically_normal().string();
}

// Forwards to `base`, counting OpenForRead per path (lexically normalized).
class CountingEnv : public Env {
 public:
  explicit CountingEnv(Env* base) : base_(base) {}
  Result<std::unique_ptr<EnvReadableFile>> OpenForRead(const std::string& path) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++opens_[Normal(path)];
    }
    return base_->OpenForRead(path);
  }
  Result<std::unique_ptr<EnvWritableFile>> CreateForWrite(const std::string& path) override {
    return base_->CreateForWrite(path);
  }
  EnvFileType Type(const std::string& path, bool follow) override {
    return base_->Type(path, follow);
  }
  Result<std::vector<std::string>> ListDirectory(const std::string& dir) override {
    return base_->ListDirectory(dir);
  }
  Status CreateDirectory(const std::string& dir) override { return base_->CreateDirectory(dir); }
  Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  Status Exchange(const std::string& a, const std::string& b) override {
    return base_->Exchange(a, b);
  }
  Status SyncDirectory(const std::string& dir) override { return base_->SyncDirectory(dir); }
  Status RemoveAll(const std::string& path) override { return base_->RemoveAll(path); }
  Result<std::unique_ptr<EnvFileLock>> LockFile(const std::string& path,
                                                std::string* holder) override {
    return base_->LockFile(path, holder);
  }

  // Opens of the .pt files, per path.
  std::map<std::string, int> PtOpens() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, int> out;
    for (const auto& [path, n] : opens_) {
      if (path.ends_with(".pt")) out[path] = n;
    }
    return out;
  }

 private:
  Env* base_;
  mutable std::mutex mu_;
  std::map<std::string, int> opens_;
};

// The files holding a 0-d optimizer.step.<param> tensor (ZeRO-3 saves torch's Adam step as
// a tensor; ReadUcpSource reads its bytes).
std::set<std::string> StepTensorFiles(const CheckpointIndex& index) {
  std::set<std::string> out;
  for (const TensorEntry& t : index.tensors) {
    if (!t.key.starts_with("optimizer.step.") || !t.global_shape.empty()) continue;
    for (const Chunk& c : t.chunks) out.insert(Normal(index.root + "/" + index.files[c.file].path));
  }
  return out;
}

std::string Ckpt(const std::string& name) {
  return testing::TestdataPath("deepspeed/" + name + "/ckpt");
}

// Every .pt under `dir` (recursively) opened at most once, and some opened.
void CheckOpenedOnce(const std::map<std::string, int>& opens, const std::string& dir) {
  CHECK_FALSE(opens.empty());
  size_t pts = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".pt") ++pts;
  }
  CHECK(opens.size() <= pts);
  for (const auto& [path, n] : opens) {
    INFO(path);
    CHECK(n == 1);
  }
}

void CheckSameLayout(const DsRepartition& a, const DsRepartition& b) {
  CHECK(a.tag == b.tag);
  CHECK(a.source_dp == b.source_dp);
  CHECK(a.variant == b.variant);
  CHECK(a.copies == b.copies);
  REQUIRE(a.source.files.size() == b.source.files.size());
  for (size_t i = 0; i < a.source.files.size(); ++i) {
    CHECK(a.source.files[i].path == b.source.files[i].path);
    CHECK(a.source.files[i].size == b.source.files[i].size);
  }
  REQUIRE(a.source.tensors.size() == b.source.tensors.size());
  for (size_t i = 0; i < a.source.tensors.size(); ++i) {
    const TensorEntry& x = a.source.tensors[i];
    const TensorEntry& y = b.source.tensors[i];
    CHECK(x.key == y.key);
    CHECK(x.global_shape == y.global_shape);
    REQUIRE(x.chunks.size() == y.chunks.size());
    for (size_t c = 0; c < x.chunks.size(); ++c) {
      CHECK(x.chunks[c].file == y.chunks[c].file);
      CHECK(x.chunks[c].byte_offset == y.chunks[c].byte_offset);
      CHECK(x.chunks[c].byte_length == y.chunks[c].byte_length);
    }
  }
  REQUIRE(a.archives.size() == b.archives.size());
  for (size_t i = 0; i < a.archives.size(); ++i) {
    const DsArchiveSpec& x = a.archives[i];
    const DsArchiveSpec& y = b.archives[i];
    CHECK(x.path == y.path);
    CHECK(x.pickle == y.pickle);
    REQUIRE(x.records.size() == y.records.size());
    for (size_t r = 0; r < x.records.size(); ++r) {
      CHECK(x.records[r].bytes == y.records[r].bytes);
      CHECK(x.records[r].elements == y.records[r].elements);
      CHECK(x.records[r].parts.size() == y.records[r].parts.size());
      CHECK(x.records[r].copy_from == y.records[r].copy_from);
      CHECK(x.records[r].copy_offset == y.records[r].copy_offset);
    }
  }
}

std::string MetaText(const UcpSource& s) {
  std::string out;
  for (const auto& [file, meta] : s.meta) {
    out += file + (meta.form == UcpFileForm::kDict ? " dict" : " raw");
    for (const auto* side : {&meta.before, &meta.after}) {
      out += " |";
      for (const auto& [k, v] : *side) out += " " + k + "=" + v->DebugString(400);
    }
    out += "\n";
  }
  return out;
}

TEST_CASE("--output-format deepspeed: each .pt opened once over open + plan",
          "[deepspeed][writer][single-open]") {
  // ZeRO 1/2, ZeRO-3, MoE, BF16_Optimizer, legacy serialization, a pipeline (layer files).
  const std::string name =
      GENERATE(std::string("zero1"), std::string("zero2"), std::string("zero3"),
               std::string("moe_zero2"), std::string("bf16"), std::string("legacy"),
               std::string("pp2"));
  const int64_t dp = name == "moe_zero2" ? 6 : 3;
  INFO(name);
  const std::string input = Ckpt(name);
  CountingEnv env(DefaultEnv());
  Result<DsRepartition> planned = InternalError("not run");
  {
    ScopedEnvOverride scope(&env);
    Result<CheckpointIndex> index = ReadDeepSpeedCheckpoint(input);
    REQUIRE(index.ok());
    REQUIRE(index->retained != nullptr);
    planned = PlanDeepSpeedRepartition(input, *index, dp);
  }
  INFO(planned.status().ToString());
  REQUIRE(planned.ok());
  CheckOpenedOnce(env.PtOpens(), input);
  Result<DsRepartition> read_here = PlanDeepSpeedRepartition(input, dp);
  REQUIRE(read_here.ok());
  CheckSameLayout(*planned, *read_here);
}

TEST_CASE("--output-format ucp: each .pt opened once over open + ReadUcpSource",
          "[deepspeed][writer][single-open]") {
  // ZeRO 1/2, ZeRO-3, TP 2 with sub-params, UCP sources (ZeRO 1/2 and ZeRO-3).
  const std::string name =
      GENERATE(std::string("zero1"), std::string("zero2"), std::string("zero3"),
               std::string("tp2_fused"), std::string("ucp"), std::string("ucp_zero3"));
  INFO(name);
  const std::string input = Ckpt(name);
  CountingEnv env(DefaultEnv());
  CheckpointIndex kept;
  std::vector<std::string> params;
  Result<UcpSource> source = InternalError("not run");
  std::map<std::string, int> at_open;
  {
    ScopedEnvOverride scope(&env);
    Result<CheckpointIndex> index = ReadDeepSpeedCheckpoint(input);
    REQUIRE(index.ok());
    REQUIRE(index->retained != nullptr);
    for (const TensorEntry& t : index->tensors) {
      if (index->FindTensor("optimizer.exp_avg." + t.key) != nullptr) params.push_back(t.key);
    }
    REQUIRE_FALSE(params.empty());
    at_open = env.PtOpens();
    source = ReadUcpSource(input, *index, params);
    kept = std::move(*index);
  }
  INFO(source.status().ToString());
  REQUIRE(source.ok());
  // ReadUcpSource opened no .pt but for the step tensor's bytes; the reader each once, but
  // for its replica comparisons at TP > 1.
  const std::set<std::string> step_files = StepTensorFiles(kept);
  std::map<std::string, int> total = env.PtOpens();
  for (const auto& [path, n] : total) {
    INFO(path);
    CHECK(n - at_open[path] <= (step_files.count(path) ? 1 : 0));
  }
  if (kept.Attribute("deepspeed.tp_degree") == "1") {
    if (step_files.empty()) CheckOpenedOnce(total, input);
    CheckOpenedOnce(at_open, input);
  }
  // The same as read from the files (the index's tensors and attributes, nothing kept).
  CheckpointIndex bare = kept;
  bare.retained.reset();
  Result<UcpSource> read_here = ReadUcpSource(input, bare, params);
  REQUIRE(read_here.ok());
  CHECK(source->universal == read_here->universal);
  CHECK(source->dir == read_here->dir);
  CHECK(source->copy_files == read_here->copy_files);
  CHECK(source->optimizer_state_copy == read_here->optimizer_state_copy);
  CHECK(source->optimizer_state_archive == read_here->optimizer_state_archive);
  CHECK(MetaText(*source) == MetaText(*read_here));
}

}  // namespace
}  // namespace fc
