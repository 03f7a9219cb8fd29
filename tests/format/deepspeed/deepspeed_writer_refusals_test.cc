// Refusals of the DeepSpeed writers (issue 34 item 1): PlanDeepSpeedRepartition
// (src/format/deepspeed/deepspeed_writer.cc, fc-convert --output-format deepspeed --dp N),
// UcpWriter and ReadUcpSource (src/format/deepspeed/ucp_writer.cc, --output-format ucp).
// Each section copies a fixture of testdata/deepspeed, changes one thing (a data.pkl value
// through tests/format/megatron/pickle_edit.h, a view, a storage class, a file name) and
// asserts the code and the message that names the file, the tensor and the values. The
// writer reads its sources with ReadDeepSpeedPtFile only (not the reader's checks), so each
// edit reaches the writer's own check.
#include "fc/format/deepspeed_writer.h"
#include "fc/format/ucp_writer.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "src/format/deepspeed/ds_source_file.h"
#include "tests/format/deepspeed/ds_fixture_edit.h"
#include "tests/format/megatron/pickle_edit.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using testing::At;
using testing::AtInt;
using testing::EntriesOf;
using testing::Erase;
using testing::M;
using testing::PV;
using testing::Set;
using testing::SetView;
using testing::ZipRecords;

using testing::deepspeed::Edit;
using testing::deepspeed::EditOsd;
using testing::deepspeed::Fixture;
// A copy of fixture `name`'s tag dir named global_step3 (the writer names its output after it).
std::string CopyTag(const testing::TempDir& tmp, const std::string& name) {
  return testing::deepspeed::CopyTag(tmp, name, /*keep_tag_name=*/true);
}
void Rename(const std::string& dir, const std::string& from, const std::string& to) {
  std::filesystem::rename(dir + "/" + from, dir + "/" + to);
}

void Refused(const Status& s, StatusCode code, std::initializer_list<std::string_view> parts) {
  REQUIRE_FALSE(s.ok());
  INFO(s.message());
  CHECK(s.code() == code);
  for (std::string_view p : parts) CHECK_THAT(s.message(), Catch::Contains(std::string(p)));
}
Status Plan(const std::string& dir, int64_t dp) {
  auto r = PlanDeepSpeedRepartition(dir, dp);
  REQUIRE_FALSE(r.ok());
  return r.status();
}

std::string Optim(int dp, int mp = 0) {
  return "zero_pp_rank_" + std::to_string(dp) + "_mp_rank_0" + std::to_string(mp) +
         "_optim_states.pt";
}
std::string Z3Model(int dp) {
  return "zero_pp_rank_" + std::to_string(dp) + "_mp_rank_00_model_states.pt";
}
const char* kModel = "mp_rank_00_model_states.pt";

PV& Singles(PV& osd, int64_t g) {
  return M(At(osd, "single_partition_of_fp32_groups").items[static_cast<size_t>(g)]);
}
// base_optimizer_state.state (ZeRO 1/2) of an optimizer_state_dict.
PV& BaseState(PV& osd) { return At(At(osd, "base_optimizer_state"), "state"); }
// The storage class of tensor `t` := torch.<cls>.
void SetStorageClass(PV& t, const std::string& cls) {
  testing::StorageId(t).items[1] = PickleGlobal("torch", cls);
}
// A whole dict root replaced by an empty list.
void MakeList(PV& root) {
  PV list;
  list.kind = PV::Kind::kList;
  root = list;
}

// --- ZeRO 1/2 (PlanZero12) ----------------------------------------------------------------
// zero1: one param group, embed.weight [6, 4], layer.weight [4, 4], layer.bias [4],
// head.weight [3, 4] (56 elements) over 2 ranks of 28; zero2: two groups over 3 ranks.

TEST_CASE("deepspeed writer refusals: ZeRO 1/2 model states", "[deepspeed][writer][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyTag(tmp, "zero1");
  const std::string model = dir + "/" + kModel;
  SECTION("the model states are a list, not a dict") {
    Edit(model, MakeList);
    Refused(Plan(dir, 3), StatusCode::kDataLoss, {model + ": not a dict"});
  }
  SECTION("AutoEP layers in the model states") {
    Edit(model, [](PV& root) { Set(root, "ds_autoep_layers", PickleList({})); });
    Refused(Plan(dir, 3), StatusCode::kUnimplemented,
            {model + ": AutoEP (MoE) checkpoint: not re-partitioned"});
  }
  SECTION("no param_shapes") {
    Edit(model, [](PV& root) { Erase(root, "param_shapes"); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {model + ": no param_shapes list (needed to lay out the flat partitions)"});
  }
  SECTION("a param_shapes key that is an int") {
    Edit(model, [](PV& root) {
      EntriesOf(M(At(root, "param_shapes").items[0]))[0].first = PickleInt(7);
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss, {model + ": param_shapes key not a string"});
  }
  SECTION("a param_shapes value that is a string") {
    Edit(model, [](PV& root) {
      Set(M(At(root, "param_shapes").items[0]), "layer.bias", PickleStr("x"));
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {model + ": param_shapes['layer.bias']: shape", "is not a torch.Size"});
  }
  SECTION("a negative extent in param_shapes") {
    Edit(model, [](PV& root) {
      Set(M(At(root, "param_shapes").items[0]), "layer.bias", PickleTorchSize({-1}));
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {model + ": param_shapes['layer.bias']: shape", "has a bad extent"});
  }
  SECTION("two params of 2^62 elements: the group size overflows") {
    Edit(model, [](PV& root) {
      PV& g = M(At(root, "param_shapes").items[0]);
      Set(g, "embed.weight", PickleTorchSize({int64_t{1} << 62}));
      Set(g, "head.weight", PickleTorchSize({int64_t{1} << 62}));
    });
    Refused(Plan(dir, 3), StatusCode::kOutOfRange,
            {model + ": param_shapes group size overflows"});
  }
  SECTION("a param of 2^62 x 4 elements: its numel overflows") {
    Edit(model, [](PV& root) {
      Set(M(At(root, "param_shapes").items[0]), "embed.weight",
          PickleTorchSize({int64_t{1} << 62, 4}));
    });
    Refused(Plan(dir, 3), StatusCode::kOutOfRange,
            {model + ": param_shapes['embed.weight']: shape", "overflows"});
  }
  SECTION("a module tensor's persistent id has four items") {
    Edit(model, [](PV& root) {
      testing::StorageId(At(At(root, "module"), "norm.running_mean")).items.pop_back();
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {model + ": persistent id", "is not a torch storage"});
  }
}

TEST_CASE("deepspeed writer refusals: ZeRO 1/2 optimizer files", "[deepspeed][writer][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyTag(tmp, "zero1");
  const std::string o0 = dir + "/" + Optim(0), o1 = dir + "/" + Optim(1);
  SECTION("DP ranks 0 and 2 (rank 1's file renamed)") {
    Rename(dir, Optim(1), Optim(2));
    Refused(Plan(dir, 3), StatusCode::kNotFound,
            {dir + ": DP ranks of mp_rank_00 are not 0..1 (" + Optim(2) + ")"});
  }
  SECTION("rank 1's optimizer file at model-parallel rank 1, which has no model states") {
    Rename(dir, Optim(1), Optim(1, 1));
    Refused(Plan(dir, 3), StatusCode::kNotFound,
            {dir + ": " + Optim(1, 1) + " has no mp_rank_01_model_states.pt"});
  }
  SECTION("no optimizer_state_dict in rank 1's file") {
    Edit(o1, [](PV& root) { Erase(root, "optimizer_state_dict"); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss, {o1 + ": no optimizer_state_dict dict"});
  }
  SECTION("partition_count [2, 2] for one param group") {
    EditOsd(o0, [](PV& osd) {
      Set(osd, "partition_count", PickleList({PickleInt(2), PickleInt(2)}));
    });
    Refused(Plan(dir, 3), StatusCode::kUnimplemented,
            {o0 + ": partition_count", "is not 2 for each of the 1 param groups (MoE expert "
                                       "groups with their own DP size): not re-partitioned"});
  }
  SECTION("partition_count 3 in rank 1's file (2 files)") {
    EditOsd(o1, [](PV& osd) { Set(osd, "partition_count", PickleInt(3)); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": partition_count 3 but 2 DP rank files for mp_rank_00"});
  }
  SECTION("single_partition_of_fp32_groups empty") {
    EditOsd(o1, [](PV& osd) { At(osd, "single_partition_of_fp32_groups").items.clear(); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": single_partition_of_fp32_groups is not a list of 1 (param_shapes groups "
                  "of mp_rank_00_model_states.pt)"});
  }
  SECTION("group_paddings [2] where the rule gives 0") {
    EditOsd(o1, [](PV& osd) { Set(osd, "group_paddings", PickleList({PickleInt(2)})); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": group_paddings[0] is 2, the padding rule gives 0 (56 elements over 2 "
                  "ranks)"});
  }
  SECTION("rank 1's fp32 partition one element short") {
    EditOsd(o1, [](PV& osd) { SetView(Singles(osd, 0), {27}, {1}); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": single_partition_of_fp32_groups[0] has 27 elements, the partition rule "
                  "gives 28 (padding stripped)"});
  }
  SECTION("rank 1's fp32 partition's storage one element longer in the pickle than its record") {
    EditOsd(o1, [](PV& osd) {
      PV& id = testing::StorageId(Singles(osd, 0));
      id.items[4] = PickleInt(id.items[4]->int_value + 1);
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": single_partition_of_fp32_groups[0]: storage record holds 112 bytes, the "
                  "pickle says 116"});
  }
  SECTION("no exp_avg in rank 1's state") {
    EditOsd(o1, [](PV& osd) { Erase(AtInt(BaseState(osd), 0), "exp_avg"); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": base_optimizer_state.state[0].exp_avg is missing"});
  }
  SECTION("fp32_flat_groups (a ZeRO-3 key) in rank 0's file") {
    EditOsd(o0, [](PV& osd) { Set(osd, "fp32_flat_groups", PickleList({})); });
    Refused(Plan(dir, 3), StatusCode::kUnimplemented,
            {o0 + ": ZeRO stage 3 (fp32_flat_groups): --output-format deepspeed re-partitions "
                  "stage 1/2 and BF16_Optimizer checkpoints"});
  }
  SECTION("partition_count a list in rank 1's file only") {
    EditOsd(o1, [](PV& osd) { Set(osd, "partition_count", PickleList({PickleInt(2)})); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": partition_count is a list in some DP ranks' files only"});
  }
  SECTION("no zero_stage in rank 1's file (BF16_Optimizer's form)") {
    EditOsd(o1, [](PV& osd) { Erase(osd, "zero_stage"); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": zero_stage present in some DP ranks' files only"});
  }
  SECTION("base_optimizer_state_step (elastic checkpoint) in rank 1's file") {
    EditOsd(o1, [](PV& osd) { Set(osd, "base_optimizer_state_step", PickleInt(3)); });
    Refused(Plan(dir, 3), StatusCode::kUnimplemented,
            {o1 + ": elastic (or missing) base_optimizer_state: not re-partitioned"});
  }
  SECTION("base_optimizer_state.state empty") {
    EditOsd(o1, [](PV& osd) { EntriesOf(BaseState(osd)).clear(); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": base_optimizer_state.state does not hold 1 groups"});
  }
  SECTION("group_paddings of two groups") {
    EditOsd(o1, [](PV& osd) {
      Set(osd, "group_paddings", PickleList({PickleInt(0), PickleInt(0)}));
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss, {o1 + ": group_paddings is not a list of 1"});
  }
  SECTION("base_optimizer_state.state key 5 (one group)") {
    EditOsd(o1, [](PV& osd) { EntriesOf(BaseState(osd))[0].first = PickleInt(5); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": base_optimizer_state.state key 5 is not a group index"});
  }
  SECTION("rank 1's fp32 partition is an IntStorage (rank 0's a FloatStorage)") {
    EditOsd(o1, [](PV& osd) { SetStorageClass(Singles(osd, 0), "IntStorage"); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": group 0 fp32 partition dtype differs by rank"});
  }
  SECTION("rank 1's exp_avg one element short") {
    EditOsd(o1, [](PV& osd) { SetView(At(AtInt(BaseState(osd), 0), "exp_avg"), {27}, {1}); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": base_optimizer_state.state[0].exp_avg has 27 elements, the padded "
                  "partition 28"});
  }
  SECTION("rank 1's exp_avg_sq is an IntStorage") {
    EditOsd(o1, [](PV& osd) {
      SetStorageClass(At(AtInt(BaseState(osd), 0), "exp_avg_sq"), "IntStorage");
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": group 0 exp_avg_sq dtype differs by rank"});
  }
  SECTION("rank 1's fp32 partition viewed as 2 x 14") {
    EditOsd(o1, [](PV& osd) { SetView(Singles(osd, 0), {2, 14}, {14, 1}); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": single_partition_of_fp32_groups[0] has 2 dimensions, a flat partition "
                  "has 1"});
  }
  SECTION("rank 1's fp32 partition's storage record removed from the zip") {
    std::string key;
    testing::RewriteTorchSave(o1, [&](PV& root, ZipRecords& z) {
      key = testing::StorageKey(Singles(At(root, "optimizer_state_dict"), 0));
      z.Remove("/data/" + key);
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": storage '" + key + "' is not in the file (or compressed)"});
  }
  SECTION("rank 0's fp32 partition over an UntypedStorage (_rebuild_tensor_v3)") {
    EditOsd(o0, [](PV& osd) {
      PV& t = Singles(osd, 0);
      PV* call = &t;
      if (t.CalleeGlobal()->name == "_rebuild_parameter") call = &M(M(call->args).items[0]);
      M(call->callee).name = "_rebuild_tensor_v3";
      PV& args = M(call->args);
      REQUIRE(args.items.size() == 6);
      args.items.push_back(PickleGlobal("torch", "float32"));
      PV& id = testing::StorageId(t);
      id.items[1] = PickleGlobal("torch", "UntypedStorage");
      id.items[4] = PickleInt(id.items[4]->int_value * 4);  // UntypedStorage counts bytes
    });
    Refused(Plan(dir, 3), StatusCode::kUnimplemented,
            {o0 + ": group 0: storage", "is not a typed torch storage"});
  }
}

TEST_CASE("deepspeed writer refusals: ZeRO 1/2 two groups", "[deepspeed][writer][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyTag(tmp, "zero2");
  const std::string o1 = dir + "/" + Optim(1);
  // base_optimizer_state.state keys 0, 0 (group 1's state under group 0's key).
  EditOsd(o1, [](PV& osd) { EntriesOf(BaseState(osd))[1].first = PickleInt(0); });
  Refused(Plan(dir, 2), StatusCode::kDataLoss,
          {o1 + ": base_optimizer_state.state holds group 0 twice"});
}

// --- ZeRO-3 (PlanZero3) -------------------------------------------------------------------
// zero3: two sub-groups (embed.weight [5, 3] + layer.bias [3]; head.bias [1] +
// layer.weight [3, 3]) and frozen.weight [5] over 2 ranks.

TEST_CASE("deepspeed writer refusals: ZeRO-3 files", "[deepspeed][writer][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyTag(tmp, "zero3");
  const std::string m0 = dir + "/" + Z3Model(0), m1 = dir + "/" + Z3Model(1);
  const std::string o0 = dir + "/" + Optim(0), o1 = dir + "/" + Optim(1);
  SECTION("every file at model-parallel rank 1, none at 0") {
    for (int r : {0, 1}) {
      Rename(dir, Z3Model(r), "zero_pp_rank_" + std::to_string(r) + "_mp_rank_01_model_states.pt");
      Rename(dir, Optim(r), Optim(r, 1));
    }
    Refused(Plan(dir, 3), StatusCode::kNotFound, {dir + ": model-parallel ranks are not 0..0"});
  }
  SECTION("DP rank 1's files renamed to rank 2") {
    Rename(dir, Z3Model(1), Z3Model(2));
    Rename(dir, Optim(1), Optim(2));
    Refused(Plan(dir, 3), StatusCode::kNotFound, {dir + ": DP ranks of mp_rank_00 are not 0..1"});
  }
  SECTION("no optimizer file of DP rank 1") {
    std::filesystem::remove(o1);
    Refused(Plan(dir, 3), StatusCode::kNotFound,
            {dir + ": mp_rank_00: 2 ZeRO-3 model-states files but 1 optimizer files"});
  }
  SECTION("model-parallel rank 1 with one DP rank, rank 0 with two") {
    std::filesystem::copy_file(m0, dir + "/zero_pp_rank_0_mp_rank_01_model_states.pt");
    std::filesystem::copy_file(o0, dir + "/" + Optim(0, 1));
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {dir + ": mp_rank_01 has 1 DP ranks, mp_rank_00 2"});
  }
  SECTION("no optimizer_state_dict in rank 1's optimizer file") {
    Edit(o1, [](PV& root) { Erase(root, "optimizer_state_dict"); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss, {o1 + ": no optimizer_state_dict"});
  }
  SECTION("partition_count 3 in rank 1's optimizer file") {
    EditOsd(o1, [](PV& osd) { Set(osd, "partition_count", PickleInt(3)); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": partition_count 3 but 2 DP rank files for mp_rank_00"});
  }
  SECTION("rank 1's model states are a list") {
    Edit(m1, MakeList);
    Refused(Plan(dir, 3), StatusCode::kDataLoss, {m1 + ": not a dict"});
  }
  SECTION("no param_shapes") {
    Edit(m0, [](PV& root) { Erase(root, "param_shapes"); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss, {m0 + ": no param_shapes list"});
  }
  SECTION("a param_shapes key that is an int") {
    Edit(m0, [](PV& root) {
      EntriesOf(M(At(root, "param_shapes").items[1]))[0].first = PickleInt(7);
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss, {m0 + ": param_shapes key not a string"});
  }
  SECTION("a frozen_param_shapes key that is an int") {
    Edit(m0, [](PV& root) { EntriesOf(At(root, "frozen_param_shapes"))[0].first = PickleInt(7); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {m0 + ": frozen_param_shapes key not a string"});
  }
  SECTION("rank 1's frozen fragment holds 2 elements") {
    Edit(m1, [](PV& root) {
      SetView(At(At(root, "frozen_param_fragments"), "frozen.weight"), {2}, {1});
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {m1 + ": frozen_param_fragments['frozen.weight'] has 2 elements, ceil(5 / 2) is 3"});
  }
  SECTION("rank 1's frozen fragment is bfloat16, rank 0's float16") {
    Edit(m1, [](PV& root) {
      SetStorageClass(At(At(root, "frozen_param_fragments"), "frozen.weight"), "BFloat16Storage");
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {m1 + ": frozen_param_fragments['frozen.weight'] dtype differs by rank"});
  }
  SECTION("AutoEP partition groups in rank 0's optimizer file") {
    EditOsd(o0, [](PV& osd) { Set(osd, "ds_zero_partition_groups", PickleList({})); });
    Refused(Plan(dir, 3), StatusCode::kUnimplemented,
            {o0 + ": AutoEP ZeRO-3 partition groups: not re-partitioned"});
  }
  SECTION("fp32_flat_groups of one sub-group") {
    EditOsd(o1, [](PV& osd) { At(osd, "fp32_flat_groups").items.pop_back(); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": fp32_flat_groups is not a list of 2 (param_shapes sub-groups)"});
  }
  SECTION("optimizer_state_dict.state of one sub-group") {
    EditOsd(o1, [](PV& osd) {
      EntriesOf(At(At(osd, "optimizer_state_dict"), "state")).pop_back();
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": optimizer_state_dict.state does not hold 2 sub-groups"});
  }
  SECTION("optimizer_state_dict.state key 'x'") {
    EditOsd(o1, [](PV& osd) {
      EntriesOf(At(At(osd, "optimizer_state_dict"), "state"))[0].first = PickleStr("x");
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": optimizer_state_dict.state key", "x", "is not a sub-group index"});
  }
  SECTION("optimizer_state_dict.state keys 0, 0") {
    EditOsd(o1, [](PV& osd) {
      EntriesOf(At(At(osd, "optimizer_state_dict"), "state"))[1].first = PickleInt(0);
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": optimizer_state_dict.state holds sub-group 0 twice"});
  }
  SECTION("rank 1's fp32_flat_groups[0] holds 9 elements") {
    EditOsd(o1, [](PV& osd) { SetView(M(At(osd, "fp32_flat_groups").items[0]), {9}, {1}); });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": fp32_flat_groups[0] has 9 elements, its params' slices 10"});
  }
  SECTION("rank 1's exp_avg of sub-group 1 is an IntStorage") {
    EditOsd(o1, [](PV& osd) {
      SetStorageClass(At(AtInt(At(At(osd, "optimizer_state_dict"), "state"), 1), "exp_avg"),
                      "IntStorage");
    });
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {o1 + ": optimizer_state_dict.state[1].exp_avg dtype differs by rank"});
  }
  SECTION("an expert file beside ZeRO-3 files") {
    testing::WriteFileBytes(dir + "/layer_0_expert_0_mp_rank_00_model_states.pt",
                            testing::AsBytes("x"));
    Refused(Plan(dir, 3), StatusCode::kUnimplemented,
            {dir + ": MoE checkpoint (expert files) with ZeRO-3: not re-partitioned"});
  }
  SECTION("rank 1's model states named bf16_zero_pp_rank_1_*") {
    Rename(dir, Z3Model(1), "bf16_" + Z3Model(1));
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {dir + ": ZeRO-3 model-states files with different prefixes (zero_pp_rank_*, "
                   "bf16_zero_pp_rank_*)"});
  }
  SECTION("an mp_rank_00_model_states.pt beside the per-rank model states") {
    std::filesystem::copy_file(Fixture("zero1") + "/ckpt/global_step3/" + kModel,
                               dir + "/" + kModel);
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {dir + ": both ZeRO-3 per-rank model states and " + kModel});
  }
}

// --- MoE with ZeRO 1/2 (PlanMoeZero12) ----------------------------------------------------
// moe_zero2: 4 DP ranks, param groups with partition_count [4, 4, 2, 2] (expert groups over
// 2 expert-parallel ranks).

TEST_CASE("deepspeed writer refusals: MoE ZeRO 1/2", "[deepspeed][writer][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyTag(tmp, "moe_zero2");
  const std::string model = dir + "/" + kModel;
  const std::string o0 = dir + "/" + Optim(0), o1 = dir + "/" + Optim(1);
  SECTION("the model states are a list") {
    Edit(model, MakeList);
    Refused(Plan(dir, 2), StatusCode::kDataLoss, {model + ": not a dict"});
  }
  SECTION("DP rank 3's file renamed to rank 5") {
    Rename(dir, Optim(3), Optim(5));
    Refused(Plan(dir, 2), StatusCode::kNotFound,
            {dir + ": DP ranks are not 0..3 (" + Optim(5) + ")"});
  }
  SECTION("fp32_flat_groups (ZeRO-3) in rank 0's file") {
    EditOsd(o0, [](PV& osd) { Set(osd, "fp32_flat_groups", PickleList({})); });
    Refused(Plan(dir, 2), StatusCode::kUnimplemented,
            {o0 + ": MoE with ZeRO-3: not re-partitioned (MoE: ZeRO stage 1/2 and "
                  "BF16_Optimizer)"});
  }
  SECTION("no zero_stage in rank 1's file") {
    EditOsd(o1, [](PV& osd) { Erase(osd, "zero_stage"); });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o1 + ": zero_stage present in some DP ranks' files only"});
  }
  SECTION("base_optimizer_state_step in rank 1's file") {
    EditOsd(o1, [](PV& osd) { Set(osd, "base_optimizer_state_step", PickleInt(3)); });
    Refused(Plan(dir, 2), StatusCode::kUnimplemented,
            {o1 + ": elastic (or missing) base_optimizer_state: not re-partitioned"});
  }
  SECTION("rank 1's group_paddings of three groups") {
    EditOsd(o1, [](PV& osd) {
      Set(osd, "group_paddings", PickleList({PickleInt(0), PickleInt(0), PickleInt(0)}));
    });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o1 + ": group_paddings is not a list of 4 paddings of its partitions"});
  }
  SECTION("no param_slice_mappings in rank 1's file") {
    EditOsd(o1, [](PV& osd) { Erase(osd, "param_slice_mappings"); });
    Refused(Plan(dir, 2), StatusCode::kUnimplemented,
            {o1 + ": no param_slice_mappings for 4 groups (a MoE checkpoint has no "
                  "param_shapes; they name the params)"});
  }
  SECTION("rank 1's base_optimizer_state.state has key 7 for group 0") {
    EditOsd(o1, [](PV& osd) { EntriesOf(BaseState(osd))[0].first = PickleInt(7); });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o1 + ": base_optimizer_state.state has no group 0"});
  }
  SECTION("no optimizer_state_dict in rank 1's file") {
    Edit(o1, [](PV& root) { Erase(root, "optimizer_state_dict"); });
    Refused(Plan(dir, 2), StatusCode::kDataLoss, {o1 + ": no optimizer_state_dict dict"});
  }
  SECTION("use_data_before_expert_parallelism 1 (an int) in rank 1's ds_config") {
    Edit(o1, [](PV& root) {
      Set(At(root, "ds_config"), "use_data_before_expert_parallelism", PickleInt(1));
    });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o1 + ": ds_config use_data_before_expert_parallelism is 1, expected a bool"});
  }
  SECTION("use_data_before_expert_parallelism True in rank 1's ds_config only") {
    Edit(o1, [](PV& root) {
      Set(At(root, "ds_config"), "use_data_before_expert_parallelism", PickleBool(true));
    });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o1 + ": ds_config use_data_before_expert_parallelism differs between the DP "
                  "ranks' files"});
  }
  SECTION("partition_count an int in rank 0's file") {
    EditOsd(o0, [](PV& osd) { Set(osd, "partition_count", PickleInt(4)); });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o0 + ": partition_count 4 is not a list of counts"});
  }
  SECTION("partition_count [4, 4, 2, 1] in rank 1's file") {
    EditOsd(o1, [](PV& osd) {
      Set(osd, "partition_count",
          PickleList({PickleInt(4), PickleInt(4), PickleInt(2), PickleInt(1)}));
    });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o1 + ": partition_count", "differs from DP rank 0's"});
  }
  SECTION("partition_count [3, 4, 2, 2] in every file") {
    for (int r = 0; r < 4; ++r) {
      EditOsd(dir + "/" + Optim(r), [](PV& osd) {
        Set(osd, "partition_count",
            PickleList({PickleInt(3), PickleInt(4), PickleInt(2), PickleInt(2)}));
      });
    }
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o0 + ": partition_count[0] = 3 does not divide the 4 DP ranks"});
  }
  SECTION("--dp 3 with expert groups over 2 expert-parallel ranks") {
    Refused(Plan(dir, 3), StatusCode::kInvalidArgument,
            {"--dp 3: param group 2 is an expert group over 2 expert-parallel ranks; the new "
             "DP size must be a multiple of 2"});
  }
  SECTION("rank 1's single_partition_of_fp32_groups of three groups") {
    EditOsd(o1, [](PV& osd) { At(osd, "single_partition_of_fp32_groups").items.pop_back(); });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o1 + ": single_partition_of_fp32_groups is not a list of 4"});
  }
  SECTION("a fragment_address whose numel is a string") {
    EditOsd(o0, [](PV& osd) {
      PV& frag = At(M(At(osd, "param_slice_mappings").items[1]), "norm.bias");
      Set(M(frag.state), "numel", PickleStr("x"));
    });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o0 + ": param_slice_mappings[1] entry", "norm.bias",
             "is not name: fragment_address(numel, start)"});
  }
  const std::string expert0 = "layers.1.moe.deepspeed_moe.experts.deepspeed_experts.0.";
  SECTION("a fragment one element after where the one before ends") {
    EditOsd(o0, [&](PV& osd) {
      PV& frag = At(M(At(osd, "param_slice_mappings").items[2]), expert0 + "fc2.weight");
      Set(M(frag.state), "start", PickleInt(13));
    });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o0 + ": param_slice_mappings[2]: '" + expert0 + "fc2.weight' at flat element 13 "
                  "(12 elements), expected the params back to back from 12"});
  }
  SECTION("a param of expert group 2 split around another (rank 2's first fragment renamed)") {
    // Expert-parallel rank 0 of group 2 is DP ranks 0 and 2: rank 0 holds fc1.weight and
    // fc2.weight, rank 2's first fragment is renamed fc1.weight.
    EditOsd(dir + "/" + Optim(2), [&](PV& osd) {
      EntriesOf(M(At(osd, "param_slice_mappings").items[2]))[0].first =
          PickleStr(expert0 + "fc1.weight");
    });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {dir + "/" + Optim(2) + ": param_slice_mappings[2]: '" + expert0 +
             "fc1.weight' is split around another param"});
  }
  SECTION("rank 3's fragment of group 0 left out: 36 elements, partitions of 12") {
    EditOsd(dir + "/" + Optim(3), [](PV& osd) {
      EntriesOf(M(At(osd, "param_slice_mappings").items[0])).clear();
    });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o0 + ": group 0 partitions of 12 elements, but its params' 36 elements over 4 "
                  "ranks give 10"});
  }
  SECTION("rank 1's group_paddings[0] 1 where the rule gives 0") {
    EditOsd(o1, [](PV& osd) {
      Set(osd, "group_paddings", PickleList({PickleInt(1), PickleInt(0), PickleInt(0),
                                             PickleInt(0)}));
    });
    Refused(Plan(dir, 2), StatusCode::kDataLoss,
            {o1 + ": group 0 partition holds 12 elements; the padding rule gives 12 + 0 "
                  "padding"});
  }
  SECTION("no ZeRO optimizer files (the moe fixture: expp_rank files only)") {
    Refused(Plan(Fixture("moe") + "/ckpt", 2), StatusCode::kUnimplemented,
            {"global_step3: MoE checkpoint (expert files) with tensor or pipeline parallelism, "
             "ZeRO-3 or no ZeRO optimizer files: not re-partitioned"});
  }
}

// --- The tag dir (PlanDeepSpeedRepartition, ResolveTagDir) -------------------------------

TEST_CASE("deepspeed writer refusals: the tag dir", "[deepspeed][writer][refusals]") {
  testing::TempDir tmp;
  SECTION("--dp out of range") {
    Refused(Plan(Fixture("zero1") + "/ckpt", 0), StatusCode::kInvalidArgument,
            {"--dp 0: the new data-parallel size must be between 1 and 2^20"});
    Refused(Plan(Fixture("zero1") + "/ckpt", (int64_t{1} << 20) + 1),
            StatusCode::kInvalidArgument, {"--dp 1048577: the new data-parallel size"});
  }
  SECTION("a Universal Checkpoint") {
    Refused(Plan(Fixture("ucp") + "/ckpt", 2), StatusCode::kUnimplemented,
            {"ckpt: a Universal Checkpoint is loaded at any DP size (load_universal); "
             "--output-format deepspeed re-partitions ZeRO checkpoints only"});
  }
  SECTION("latest names a tag that does not exist") {
    const std::string save = tmp.path() + "/save";
    std::filesystem::create_directories(save);
    testing::WriteFileBytes(save + "/latest", testing::AsBytes("global_step9\n"));
    Refused(Plan(save, 2), StatusCode::kNotFound, {save + "/global_step9: no tag directory"});
  }
  const std::string dir = CopyTag(tmp, "zero1");
  SECTION("a directory in the tag dir") {
    std::filesystem::create_directories(dir + "/offload");
    Refused(Plan(dir, 3), StatusCode::kUnimplemented,
            {dir + "/offload: a directory in the tag dir (NVMe-offloaded optimizer state?) is "
                   "not re-partitioned"});
  }
  SECTION("a file of no known kind") {
    testing::WriteFileBytes(dir + "/notes.txt", testing::AsBytes("x"));
    Refused(Plan(dir, 3), StatusCode::kUnimplemented,
            {dir + "/notes.txt: a file --output-format deepspeed does not know"});
  }
  SECTION("optimizer files zero_pp_rank_0_* and bf16_zero_pp_rank_1_*") {
    Rename(dir, Optim(1), "bf16_" + Optim(1));
    Refused(Plan(dir, 3), StatusCode::kDataLoss,
            {dir + ": optimizer files with different prefixes (zero_pp_rank_*, "
                   "bf16_zero_pp_rank_*)"});
  }
  SECTION("no model states") {
    std::filesystem::remove(dir + "/" + kModel);
    Refused(Plan(dir, 3), StatusCode::kNotFound, {dir + ": no mp_rank_XX_model_states.pt"});
  }
  SECTION("model states of model-parallel rank 1 only") {
    Rename(dir, kModel, "mp_rank_01_model_states.pt");
    Refused(Plan(dir, 3), StatusCode::kNotFound,
            {dir + ": model-parallel ranks are not 0..0 (mp_rank_01_model_states.pt)"});
  }
  SECTION("tp2: no optimizer files for model-parallel rank 1") {
    const std::string tp = CopyTag(tmp, "tp2");
    for (int r : {0, 1}) std::filesystem::remove(tp + "/" + Optim(r, 1));
    Refused(Plan(tp, 3), StatusCode::kNotFound,
            {tp + ": optimizer files for 1 of 2 model-parallel ranks"});
  }
  SECTION("tp2: model-parallel rank 1 with one DP rank, rank 0 with two") {
    const std::string tp = CopyTag(tmp, "tp2");
    std::filesystem::remove(tp + "/" + Optim(1, 1));
    Refused(Plan(tp, 3), StatusCode::kDataLoss,
            {tp + ": mp_rank_01 has 1 DP ranks, mp_rank_00 2"});
  }
}

// --- UcpWriter and ReadUcpSource ----------------------------------------------------------

TEST_CASE("ucp writer refusals: file paths and sizes", "[deepspeed][writer][refusals]") {
  testing::TempDir tmp;
  auto create = [&](const std::string& path, Shape shape) {
    auto w = UcpWriter::Create(tmp.path(), {UcpFileSpec{path, DType::kFloat32, shape, {}}});
    return w.ok() ? Status::Ok() : w.status();
  };
  Refused(create("/tmp/fp32.pt", {2}), StatusCode::kInvalidArgument,
          {"UCP file path '/tmp/fp32.pt' is not relative"});
  Refused(create("zero/../x/fp32.pt", {2}), StatusCode::kInvalidArgument,
          {"UCP file path 'zero/../x/fp32.pt' has an empty, '.' or '..' component"});
  Refused(create("zero/big/fp32.pt", {int64_t{1} << 62, 8}), StatusCode::kOutOfRange,
          {"zero/big/fp32.pt: tensor size overflows"});
  CHECK(std::filesystem::is_empty(tmp.path()));
  // A file none of whose tensor bytes were written.
  auto w = UcpWriter::Create(tmp.path(), {UcpFileSpec{"zero/a/fp32.pt", DType::kFloat32, {2}, {}}});
  REQUIRE(w.ok());
  Refused((*w)->Finish(), StatusCode::kInternal,
          {"zero/a/fp32.pt: not every tensor byte was written"});
  // Bytes outside the file's tensor, twice, or for a file that does not exist.
  const auto four = testing::AsBytes("abcd");
  Refused((*w)->Write(1, 0, four), StatusCode::kInvalidArgument,
          {tmp.path() + ": UCP file index 1 out of range"});
  Refused((*w)->Write(0, 6, four), StatusCode::kInvalidArgument,
          {"zero/a/fp32.pt: tensor bytes [6, +4) pass its end 8"});
  REQUIRE((*w)->Write(0, 0, four).ok());
  Refused((*w)->Write(0, 2, four), StatusCode::kInvalidArgument,
          {"zero/a/fp32.pt: tensor bytes at 2 written twice"});
}

TEST_CASE("ucp writer refusals: the source's optimizer state", "[deepspeed][writer][refusals]") {
  testing::TempDir tmp;
  // ReadUcpSource takes the variant from the index; the tensors only for a tensor step.
  CheckpointIndex zero3;
  zero3.attributes["deepspeed.optimizer"] = "zero3";
  const std::string dir = CopyTag(tmp, "zero3");
  const std::string o0 = dir + "/" + Optim(0);
  auto read = [&](const CheckpointIndex& index) {
    auto r = ReadUcpSource(dir, index, {"embed.weight"});
    REQUIRE_FALSE(r.ok());
    return r.status();
  };
  SECTION("no optimizer file of DP rank 0") {
    std::filesystem::remove(o0);
    Refused(read(zero3), StatusCode::kNotFound,
            {dir + ": no zero_pp_rank_0_mp_rank_00 optimizer states file to take the UCP's "
                   "optimizer state and merge rules from"});
  }
  SECTION("no model states of rank 0") {
    std::filesystem::remove(dir + "/" + Z3Model(0));
    Refused(read(zero3), StatusCode::kNotFound, {dir + ": no mp_rank_00 model states file"});
  }
  SECTION("no optimizer_state_dict in rank 0's optimizer file") {
    Edit(o0, [](PV& root) { Erase(root, "optimizer_state_dict"); });
    Refused(read(zero3), StatusCode::kDataLoss, {o0 + ": no optimizer_state_dict dict"});
  }
  SECTION("ZeRO-3: no param_groups in the inner optimizer_state_dict") {
    EditOsd(o0, [](PV& osd) { Erase(At(osd, "optimizer_state_dict"), "param_groups"); });
    Refused(read(zero3), StatusCode::kDataLoss,
            {o0 + ": no param_groups in optimizer_state_dict"});
  }
  SECTION("ZeRO 1/2: no param_groups in base_optimizer_state") {
    const std::string z1 = CopyTag(tmp, "zero1");
    EditOsd(z1 + "/" + Optim(0), [](PV& osd) {
      Erase(At(osd, "base_optimizer_state"), "param_groups");
    });
    auto r = ReadUcpSource(z1, CheckpointIndex{}, {"embed.weight"});
    Refused(r.status(), StatusCode::kDataLoss,
            {z1 + "/" + Optim(0) + ": no param_groups in base_optimizer_state"});
  }
  SECTION("ZeRO-3: the inner optimizer_state_dict has no state") {
    EditOsd(o0, [](PV& osd) { Erase(At(osd, "optimizer_state_dict"), "state"); });
    Refused(read(zero3), StatusCode::kDataLoss,
            {o0 + ": optimizer_state_dict['optimizer_state_dict'] has no state dict or no "
                  "param_groups"});
  }
  SECTION("ZeRO-3: sub-group 0's state has no step") {
    EditOsd(o0, [](PV& osd) {
      Erase(AtInt(At(At(osd, "optimizer_state_dict"), "state"), 0), "step");
    });
    Refused(read(zero3), StatusCode::kDataLoss,
            {o0 + ": optimizer_state_dict['optimizer_state_dict']['state'][0] has no 'step'"});
  }
  SECTION("ZeRO-3: a tensor step, but the index has no optimizer.step.<param>") {
    Refused(read(zero3), StatusCode::kDataLoss,
            {o0 + ": the Adam step is a tensor, but fc found no 0-d optimizer.step.<param> "
                  "tensor holding it"});
  }
}

// tp2_fused: universal_checkpoint_info's parameter_with_sub_params entry 0 is attn.qkv.weight,
// partition_dim 0, shape ((6, 2, 2), -1), version 0.4.
TEST_CASE("ucp writer refusals: parameter_with_sub_params", "[deepspeed][writer][refusals]") {
  testing::TempDir tmp;
  const std::string dir = CopyTag(tmp, "tp2_fused");
  const std::string model = dir + "/" + kModel;
  auto entry0 = [](PV& root) -> PV& {
    return M(At(At(root, "universal_checkpoint_info"), "parameter_with_sub_params").items[0]);
  };
  SECTION("partition_dim 5 of a 2-item shape") {
    Edit(model, [&](PV& root) { Set(entry0(root), "partition_dim", PickleInt(5)); });
    auto r = ReadUcpSource(dir, CheckpointIndex{}, {"attn.qkv.weight"});
    Refused(r.status(), StatusCode::kDataLoss,
            {model, "parameter_with_sub_params entry for 'attn.qkv.weight' has no usable "
                    "shape / partition_dim"});
  }
  SECTION("version 0.3: a count of 3 sub-params for a merged dim of 8") {
    Edit(model, [&](PV& root) {
      Set(At(root, "universal_checkpoint_info"), "universal_checkpoint_version",
          testing::PickleFloat(0.3));
      Set(entry0(root), "shape", PickleTuple({PickleInt(3), PickleInt(-1)}));
    });
    CheckpointIndex index;
    TensorEntry qkv;
    qkv.key = "attn.qkv.weight";
    qkv.global_shape = {8, 4};
    index.tensors.push_back(qkv);
    auto r = ReadUcpSource(dir, index, {"attn.qkv.weight"});
    Refused(r.status(), StatusCode::kDataLoss,
            {model, "'attn.qkv.weight': 3 sub-params do not divide its merged dim 0"});
  }
}

// A value shared through the memo at every level (80 nested pairs [x, x], 2^80 values when
// walked per reference): the storage-class lookup and the UCP writer's tensor check look
// into each node once.
TEST_CASE("deepspeed writer: a storage class is looked for once per shared node",
          "[deepspeed_writer][hostile]") {
  PickleValue::Ptr shared = PickleList({});
  for (int i = 0; i < 80; ++i) shared = PickleList({shared, shared});
  CHECK_FALSE(HoldsTensor(*shared));
  auto cls = deepspeed_writer_internal::StorageClassOf(*shared, "x.pt: state");
  CHECK(cls.status().code() == StatusCode::kNotFound);
  CHECK(cls.status().message() == "x.pt: state: no storage");
}

}  // namespace
}  // namespace fc
