// Refusals of the DeepSpeed reader (src/format/deepspeed/) reached from a file
// (issue 34 item 1), first those that guard the partition math, shapes, dtypes and sizes,
// where a missing check would give a silently wrong tensor. Each section copies a fixture of
// testdata/deepspeed, changes one thing (a data.pkl value through
// tests/format/megatron/pickle_edit.h, a view, a storage class, a file) and asserts the code
// and the message that names the file, the tensor and the values. Refusals reached by the
// older tests (deepspeed_test.cc) are listed in the closing note of issue 34.
#include "fc/format/deepspeed.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include "fc/format/chunk_reader.h"
#include "tests/format/deepspeed/ds_fixture_edit.h"
#include "tests/format/megatron/pickle_edit.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using testing::At;
using testing::AtInt;
using testing::EncodePickle;
using testing::EntriesOf;
using testing::Erase;
using testing::M;
using testing::PickleFloat;
using testing::PickleIntTuple;
using testing::PV;
using testing::Set;
using testing::SetView;
using testing::ZipRecords;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

using testing::deepspeed::CopyTag;
using testing::deepspeed::Edit;
using testing::deepspeed::EditOsd;
using testing::deepspeed::Fixture;

void Refused(const Result<CheckpointIndex>& r, StatusCode code,
             std::initializer_list<std::string_view> parts) {
  REQUIRE_FALSE(r.ok());
  INFO(r.status().message());
  CHECK(r.status().code() == code);
  for (std::string_view p : parts) CHECK_THAT(r.status().message(), Catch::Contains(std::string(p)));
}

std::string Optim(int dp) {
  return "zero_pp_rank_" + std::to_string(dp) + "_mp_rank_00_optim_states.pt";
}
std::string Z3Model(int dp) {
  return "zero_pp_rank_" + std::to_string(dp) + "_mp_rank_00_model_states.pt";
}
const char* kModel = "mp_rank_00_model_states.pt";

PV& Singles(PV& osd, int64_t g) {
  return M(At(osd, "single_partition_of_fp32_groups").items[static_cast<size_t>(g)]);
}
PV& Mapping(PV& osd, int64_t g) {
  return M(At(osd, "param_slice_mappings").items[static_cast<size_t>(g)]);
}
// fragment_address(numel, start) of `name` in a param_slice_mappings dict.
void SetFragment(PV& mapping, std::string_view name, int64_t numel, int64_t start) {
  PV& frag = At(mapping, name);
  Set(M(frag.state), "numel", PickleInt(numel));
  Set(M(frag.state), "start", PickleInt(start));
}
// param_shapes[g][name] := torch.Size(dims)
void SetParamShape(PV& root, size_t g, std::string_view name, const std::vector<int64_t>& dims) {
  PV& group = M(At(root, "param_shapes").items[g]);
  Set(group, name, PickleTorchSize(dims));
}
// Appends `extra` zero elements of `item` bytes to the storage of tensor `t` (its record and
// the numel of its persistent id).
void GrowStorage(PV& t, ZipRecords& z, int64_t extra, size_t item) {
  PV& id = testing::StorageId(t);
  id.items[4] = PickleInt(id.items[4]->int_value + extra);
  auto& rec = z.Get("/data/" + testing::StorageKey(t));
  rec.resize(rec.size() + static_cast<size_t>(extra) * item, std::byte{0});
}

// --- ZeRO 1/2 and BF16_Optimizer partitions ----------------------------------------------
// zero1: param_shapes group 0 is embed.weight [6, 4], layer.weight [4, 4], layer.bias [4],
// head.weight [3, 4] (56 elements) over 2 ranks of 28, no padding; rank 1 holds
// layer.weight[4:16], layer.bias, head.weight.

TEST_CASE("deepspeed refusals: ZeRO 1/2 partition sizes", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  SECTION("a partition one element short, group_paddings consistent (issue 34)") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      SetView(Singles(osd, 0), {27}, {1});
      Set(osd, "group_paddings", PickleList({PickleInt(1)}));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": group 0 partition holds 27 elements + 1 padding; with 56 elements in "
             "param_shapes over 2 ranks of 28 it must hold 28 + 0"});
  }
  SECTION("a partition one element short and no padding (the element count, not only the "
          "padding, is compared)") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) { SetView(Singles(osd, 0), {27}, {1}); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": group 0 partition holds 27 elements + 0 padding; with 56 elements in "
             "param_shapes over 2 ranks of 28 it must hold 28 + 0"});
  }
  SECTION("a partition padded to another size than rank 0's") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      Set(osd, "group_paddings", PickleList({PickleInt(2)}));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": group 0 partition holds 28 elements + 2 padding; with 56 elements in "
             "param_shapes over 2 ranks of 28 it must hold 28 + 0"});
  }
  SECTION("param_shapes lists more elements than the partitions hold") {
    const std::string dir = CopyTag(tmp, "zero1");
    Edit(dir + "/" + kModel, [](PV& root) { SetParamShape(root, 0, "extra.weight", {4}); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": group 0: partitions hold 56 elements, param_shapes 60"});
  }
  SECTION("param_shapes whose sum overflows") {
    const std::string dir = CopyTag(tmp, "zero1");
    Edit(dir + "/" + kModel, [](PV& root) {
      SetParamShape(root, 0, "embed.weight", {kMax});
      SetParamShape(root, 0, "head.weight", {kMax});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kOutOfRange,
            {std::string(kModel) + ": group 0 overflows"});
  }
  SECTION("a group_paddings value whose sum with the partition overflows") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      Set(osd, "group_paddings", PickleList({PickleInt(kMax)}));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kOutOfRange,
            {Optim(1) + ": group 0 padding overflows"});
  }
  SECTION("a negative group_paddings value") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      Set(osd, "group_paddings", PickleList({PickleInt(-1)}));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": group_paddings[0] is -1"});
  }
  SECTION("group_paddings listing no group") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) { Set(osd, "group_paddings", PickleList({})); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": group_paddings does not list 1 groups"});
  }
  SECTION("two fp32 partitions for param_shapes' one group") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) {
      PV& singles = At(osd, "single_partition_of_fp32_groups");
      singles.items.push_back(testing::DeepCopy(*singles.items[0]));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": single_partition_of_fp32_groups has 2 groups, param_shapes of " +
             kModel + " has 1"});
  }
  SECTION("a 2-D fp32 partition") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) { SetView(Singles(osd, 0), {4, 7}, {7, 1}); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": single_partition_of_fp32_groups[0] has shape [4, 7], expected 1-D"});
  }
  SECTION("an fp32 partition with stride 2") {
    const std::string dir = CopyTag(tmp, "zero1");
    testing::RewriteTorchSave(dir + "/" + Optim(1), [](PV& root, ZipRecords& z) {
      PV& t = Singles(At(root, "optimizer_state_dict"), 0);
      GrowStorage(t, z, 28, 4);
      SetView(t, {28}, {2});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kUnimplemented,
            {Optim(1) + ": param 'layer.weight': flat partition has stride 2"});
  }
  SECTION("an exp_avg shorter than the partition") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      SetView(At(AtInt(At(At(osd, "base_optimizer_state"), "state"), 0), "exp_avg"), {27}, {1});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": base_optimizer_state state[0].exp_avg has shape [27], expected 1-D "
             "with at least 28 elements"});
  }
  SECTION("a partition of another dtype than the other rank's") {
    // Same item size (int32 for float32): without the check the bytes would read as floats.
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      testing::StorageId(Singles(osd, 0)).items[1] = PickleGlobal("torch", "IntStorage");
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": tensor 'layer.weight' is int32 [4, 4] here but float32 [4, 4] "
             "elsewhere"});
  }
  SECTION("elastic optimizer state") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) { Set(osd, "base_optimizer_state", PickleList({})); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kUnimplemented,
            {Optim(0) + ": elastic optimizer state (base_optimizer_state is a list) is not read "
             "yet"});
  }
}

TEST_CASE("deepspeed refusals: BF16_Optimizer partitions", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  const std::string bf = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt";
  SECTION("group_paddings larger than the padded partition") {
    const std::string dir = CopyTag(tmp, "bf16");
    EditOsd(dir + "/" + bf, [](PV& osd) {
      Set(osd, "group_paddings", PickleList({PickleInt(29)}));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {bf + ": group_paddings[0] = 29 exceeds the partition's 28 elements"});
  }
  SECTION("padding where the last partition must be full") {
    const std::string dir = CopyTag(tmp, "bf16");
    EditOsd(dir + "/" + bf, [](PV& osd) {
      Set(osd, "group_paddings", PickleList({PickleInt(1)}));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {bf + ": group 0 partition holds 27 elements + 1 padding; with 56 elements in "
             "param_shapes over 2 ranks of 28 it must hold 28 + 0"});
  }
}

TEST_CASE("deepspeed refusals: param_slice_mappings against the partition math",
          "[deepspeed][refusals]") {
  testing::TempDir tmp;
  const std::string where = Optim(1) + ": param_slice_mappings[0]";
  SECTION("a wrong start") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) { SetFragment(Mapping(osd, 0), "layer.bias", 4, 13); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {where + ": 'layer.bias' should be fragment_address(numel=4, start=12) but is (4, 13)"});
  }
  SECTION("a wrong numel") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) { SetFragment(Mapping(osd, 0), "layer.weight", 16, 0); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {where + ": 'layer.weight' should be fragment_address(numel=12, start=0) but is (16, 0)"});
  }
  SECTION("a param missing") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) { Erase(Mapping(osd, 0), "head.weight"); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {where + ": 'head.weight' should be fragment_address(numel=12, start=16) but is absent"});
  }
  SECTION("a param of another rank's partition") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      PV& m = Mapping(osd, 0);
      EntriesOf(m).emplace_back(PickleStr("embed.weight"), testing::DeepCopy(At(m, "layer.bias")));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {where + " lists params outside this rank's partition"});
  }
  SECTION("an entry that is not a fragment_address") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) { Set(Mapping(osd, 0), "layer.bias", PickleInt(4)); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {where + ": entry ", "layer.bias", " is not name: fragment_address(numel, start)"});
  }
  SECTION("no mapping for the group") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) { Set(osd, "param_slice_mappings", PickleList({})); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss, {where + " is missing"});
  }
  SECTION("a mapping that is not a dict") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      Set(osd, "param_slice_mappings", PickleList({PickleInt(5)}));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss, {where + " is 5"});
  }
}

TEST_CASE("deepspeed refusals: optimizer state kinds and partition counts",
          "[deepspeed][refusals]") {
  testing::TempDir tmp;
  SECTION("zero_stage out of range") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) { Set(osd, "zero_stage", PickleInt(7)); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss, {Optim(0) + ": zero_stage is 7"});
  }
  SECTION("neither ZeRO nor BF16_Optimizer") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) {
      Erase(osd, "zero_stage");
      Erase(osd, "single_partition_of_fp32_groups");
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kUnimplemented,
            {Optim(0) + ": optimizer_state_dict is neither ZeRO (zero_stage / fp32_flat_groups) "
             "nor BF16_Optimizer"});
  }
  SECTION("no optimizer_state_dict") {
    const std::string dir = CopyTag(tmp, "zero1");
    Edit(dir + "/" + Optim(1), [](PV& root) { Set(root, "optimizer_state_dict", PickleNone()); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": no optimizer_state_dict dict"});
  }
  SECTION("partition_count missing") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) { Erase(osd, "partition_count"); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": partition_count is missing but there are 2 optimizer files for this "
             "TP rank"});
  }
  SECTION("partition_count differing per group without MoE files") {
    const std::string dir = CopyTag(tmp, "zero1");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) {
      Set(osd, "partition_count", PickleList({PickleInt(2), PickleInt(1)}));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kUnimplemented,
            {Optim(0) + ": partition_count differs per param group"});
  }
  SECTION("a missing DP rank's optimizer file below the others") {
    const std::string dir = CopyTag(tmp, "zero2");
    std::filesystem::remove(dir + "/" + Optim(0));
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {": optimizer file of DP rank 0 for mp_rank_00 is missing"});
  }
}

TEST_CASE("deepspeed refusals: frozen params", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  SECTION("a stage-2 frozen fragment of another shape than frozen_param_shapes") {
    const std::string dir = CopyTag(tmp, "frozen_tied");
    Edit(dir + "/" + kModel, [](PV& root) {
      SetView(At(At(root, "frozen_param_fragments"), "frozen.weight"), {4, 3}, {3, 1});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": frozen_param_fragments['frozen.weight'] has shape [4, 3], "
             "frozen_param_shapes says [3, 4]"});
  }
  SECTION("a frozen_param_shapes entry that is not a torch.Size") {
    const std::string dir = CopyTag(tmp, "frozen_tied");
    Edit(dir + "/" + kModel, [](PV& root) {
      Set(At(root, "frozen_param_shapes"), "frozen.weight", PickleStr("3x4"));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": frozen_param_shapes entry ", " is not name: torch.Size"});
  }
  SECTION("a frozen param without its fragment") {
    const std::string dir = CopyTag(tmp, "frozen_tied");
    Edit(dir + "/" + kModel, [](PV& root) { Erase(At(root, "frozen_param_fragments"), "frozen.weight"); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": frozen_param_fragments['frozen.weight'] is missing"});
  }
  SECTION("a ZeRO-3 frozen fragment shorter than its ceil-div piece") {
    const std::string dir = CopyTag(tmp, "zero3");
    Edit(dir + "/" + Z3Model(1), [](PV& root) {
      SetView(At(At(root, "frozen_param_fragments"), "frozen.weight"), {2}, {1});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Z3Model(1) + ": frozen_param_fragments['frozen.weight'] has shape [2], expected [3]"});
  }
}

// --- ZeRO-3 ---------------------------------------------------------------------------------
// zero3: param_shapes [embed.weight [5, 3], layer.bias [3]] and [layer.weight [3, 3],
// head.bias [1]] over 2 ranks: sub-group 0 holds 8 + 2 = 10 elements per rank, 1 holds 5 + 1.

TEST_CASE("deepspeed refusals: ZeRO-3 partitions", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  SECTION("a flat group one element short") {
    const std::string dir = CopyTag(tmp, "zero3");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      SetView(M(At(osd, "fp32_flat_groups").items[0]), {9}, {1});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": fp32_flat_groups of sub-group 0 has shape [9], expected [10] "
             "(per-param ceil(numel/2) pieces)"});
  }
  SECTION("an exp_avg one element short") {
    const std::string dir = CopyTag(tmp, "zero3");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      SetView(At(AtInt(At(At(osd, "optimizer_state_dict"), "state"), 1), "exp_avg_sq"), {5}, {1});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": exp_avg_sq of sub-group 1 has shape [5], expected [6]"});
  }
  SECTION("a flat group with stride 2") {
    const std::string dir = CopyTag(tmp, "zero3");
    testing::RewriteTorchSave(dir + "/" + Optim(1), [](PV& root, ZipRecords& z) {
      PV& t = M(At(At(root, "optimizer_state_dict"), "fp32_flat_groups").items[0]);
      GrowStorage(t, z, 10, 4);
      SetView(t, {10}, {2});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kUnimplemented,
            {Optim(1) + ": param 'embed.weight': flat partition has stride 2"});
  }
  SECTION("fp32_flat_groups listing one sub-group of two") {
    const std::string dir = CopyTag(tmp, "zero3");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) { At(osd, "fp32_flat_groups").items.pop_back(); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": fp32_flat_groups has 1 sub-groups, param_shapes has 2"});
  }
  SECTION("param_shapes whose ceil-div pieces overflow") {
    const std::string dir = CopyTag(tmp, "zero3");
    Edit(dir + "/" + Z3Model(0), [](PV& root) {
      SetParamShape(root, 0, "embed.weight", {kMax});
      SetParamShape(root, 0, "layer.bias", {kMax});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kOutOfRange,
            {Z3Model(0) + ": sub-group 0 overflows"});
  }
  SECTION("a flat partition of another dtype") {
    const std::string dir = CopyTag(tmp, "zero3");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      testing::StorageId(M(At(osd, "fp32_flat_groups").items[0])).items[1] =
          PickleGlobal("torch", "IntStorage");
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": tensor 'embed.weight' is int32 [5, 3] here but float32 [5, 3] "
             "elsewhere"});
  }
  SECTION("rank 0's model states missing") {
    const std::string dir = CopyTag(tmp, "zero3");
    std::filesystem::remove(dir + "/" + Z3Model(0));
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {": ZeRO-3 model states of DP rank 0 are missing"});
  }
  SECTION("the last rank's model states missing") {
    const std::string dir = CopyTag(tmp, "zero3");
    std::filesystem::remove(dir + "/" + Z3Model(1));
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {": 1 ZeRO-3 model state files for 2 optimizer files"});
  }
  SECTION("model states without optimizer files") {
    const std::string dir = CopyTag(tmp, "zero3");
    std::filesystem::remove(dir + "/" + Optim(0));
    std::filesystem::remove(dir + "/" + Optim(1));
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {": ZeRO-3 model states without their *_optim_states.pt files"});
  }
}

// --- MoE with ZeRO 1/2 ------------------------------------------------------------------------
// moe_zero2: 4 DP ranks, groups 0 and 1 dense (partition_count 4), 2 and 3 expert groups
// (ep_size_2, partition_count 2); group 0: 12 elements per rank (rank 3: head.weight [3, 4]);
// group 1: 2 per rank (norm.bias over ranks 0 and 1, head.bias [3] over 2 and 3 + 1 padding).

TEST_CASE("deepspeed refusals: MoE partitions", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  SECTION("partition_count not dividing the ranks") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    for (int r = 0; r < 4; ++r) {
      EditOsd(dir + "/" + Optim(r), [](PV& osd) {
        M(At(osd, "partition_count").items[2]) = *PickleInt(3);
      });
    }
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": partition_count[2] = 3 does not divide the 4 DP ranks' files"});
  }
  SECTION("partition_count differing between ranks") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(2), [](PV& osd) {
      M(At(osd, "partition_count").items[3]) = *PickleInt(4);
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(2) + ": partition_count ", " differs from " + Optim(0) + "'s"});
  }
  SECTION("partition_count of the wrong length") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) { At(osd, "partition_count").items.pop_back(); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": partition_count is ", ", expected one count per param group (4)"});
  }
  SECTION("an expert-sized group without moe: True") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) {
      Erase(M(At(At(osd, "base_optimizer_state"), "param_groups").items[2]), "moe");
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": param group 2 is partitioned over 2 of 4 ranks but is not an expert "
             "group (no moe: True)"});
  }
  SECTION("an expert group named for another ep_size") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) {
      Set(M(At(At(osd, "base_optimizer_state"), "param_groups").items[3]), "name",
          PickleStr("ep_size_4"));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": param group 3 is named 'ep_size_4' but partition_count 2 of 4 ranks "
             "means ep_size 2"});
  }
  SECTION("a fragment past the partition's end") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) {
      SetFragment(Mapping(osd, 3), "layers.1.moe.deepspeed_moe.experts.deepspeed_experts.1.fc1.bias",
                  1, 4);
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": param_slice_mappings[3]: "
             "'layers.1.moe.deepspeed_moe.experts.deepspeed_experts.1.fc1.bias' "
             "fragment_address(numel=1, start=4) is outside the partition's 4 elements"});
  }
  SECTION("a fragment that leaves a gap") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(2), [](PV& osd) {
      SetFragment(Mapping(osd, 0), "layers.1.moe.deepspeed_moe.gate.wg.weight", 11, 1);
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(2) + ": param_slice_mappings[0]: 'layers.1.moe.deepspeed_moe.gate.wg.weight' "
             "starts at flat element 25 of the group, expected 24 (params back to back)"});
  }
  SECTION("fragments covering fewer elements than the module tensor") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(3), [](PV& osd) { SetFragment(Mapping(osd, 0), "head.weight", 11, 0); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(3) + ": param 'head.weight' has 11 elements in the partitions of group 0, its "
             "module tensor [3, 4] has 12"});
  }
  SECTION("a last partition padded to another size") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(3), [](PV& osd) {
      M(At(osd, "group_paddings").items[1]) = *PickleInt(0);
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(3) + ": group 1 partition 3 holds 1 elements + 0 padding; its params' 7 "
             "elements over 4 partitions of 2 need 1 + 1"});
  }
  SECTION("a param in no module or expert file") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(2), [](PV& osd) {
      for (auto& [k, v] : EntriesOf(Mapping(osd, 1))) {
        if (k->str == "head.bias") k = PickleStr("ghost.bias");
      }
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(2) + ": param 'ghost.bias' of param group 1 is in no module or expert file, "
             "so its shape is unknown"});
  }
  SECTION("a local expert id past the experts per rank") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      for (auto& [k, v] : EntriesOf(Mapping(osd, 3))) {
        if (k->str == "layers.1.moe.deepspeed_moe.experts.deepspeed_experts.1.fc1.bias") {
          k = PickleStr("layers.1.moe.deepspeed_moe.experts.deepspeed_experts.2.fc1.bias");
        }
      }
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {": local expert 2 in 'layers.1.moe.deepspeed_moe.experts.deepspeed_experts.2.fc1.bias', "
             "but each of the 2 expert-parallel ranks holds 2"});
  }
  SECTION("an expert param of a layer without expert files") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(1), [](PV& osd) {
      for (auto& [k, v] : EntriesOf(Mapping(osd, 3))) {
        if (k->str == "layers.1.moe.deepspeed_moe.experts.deepspeed_experts.1.fc1.bias") {
          k = PickleStr("layers.9.moe.deepspeed_moe.experts.deepspeed_experts.1.fc1.bias");
        }
      }
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {": expert param 'layers.9.moe.deepspeed_moe.experts.deepspeed_experts.1.fc1.bias', "
             "but no layer_*_expert_* file holds experts named "
             "layers.9.moe.deepspeed_moe.experts.deepspeed_experts.<id>.*"});
  }
  SECTION("param_slice_mappings missing") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) { Erase(osd, "param_slice_mappings"); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kUnimplemented,
            {Optim(0) + ": param_slice_mappings[0] is missing: without param_shapes"});
  }
  SECTION("a mapping entry that is not a fragment_address") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) { Set(Mapping(osd, 1), "norm.bias", PickleInt(2)); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": param_slice_mappings[1]: entry ",
             " is not name: fragment_address(numel, start)"});
  }
  SECTION("a mapping that is not a dict") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) {
      M(At(osd, "param_slice_mappings").items[1]) = *PickleInt(5);
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": param_slice_mappings[1] is 5"});
  }
  SECTION("no fp32 partition list") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    EditOsd(dir + "/" + Optim(0), [](PV& osd) { Erase(osd, "single_partition_of_fp32_groups"); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(0) + ": no single_partition_of_fp32_groups list"});
  }
  SECTION("use_data_before_expert_parallelism not a bool") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    Edit(dir + "/" + Optim(1), [](PV& root) {
      Set(At(root, "ds_config"), "use_data_before_expert_parallelism", PickleInt(1));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": ds_config use_data_before_expert_parallelism is 1, expected a bool"});
  }
  SECTION("use_data_before_expert_parallelism differing between ranks") {
    const std::string dir = CopyTag(tmp, "moe_zero2");
    Edit(dir + "/" + Optim(1), [](PV& root) {
      Set(At(root, "ds_config"), "use_data_before_expert_parallelism", PickleBool(true));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {Optim(1) + ": ds_config use_data_before_expert_parallelism differs from " + Optim(0) +
             "'s"});
  }
}

// --- Directories, topology, module states ---------------------------------------------------

TEST_CASE("deepspeed refusals: directories and topology", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  SECTION("a latest file naming a path, not a tag") {
    const std::string save = tmp.path() + "/save";
    std::filesystem::create_directories(save + "/global_step3");
    testing::CopyDirectoryFiles(Fixture("zero1") + "/ckpt/global_step3", save + "/global_step3");
    testing::WriteFileBytes(save + "/latest", testing::AsBytes("../global_step3\n"));
    Refused(ReadDeepSpeedCheckpoint(save), StatusCode::kDataLoss,
            {"/latest: '../global_step3' is not a tag directory name"});
  }
  SECTION("a model states file that is neither a zip nor a legacy torch.save") {
    const std::string dir = CopyTag(tmp, "zero1");
    testing::WriteFileBytes(dir + "/" + kModel, testing::AsBytes("not a checkpoint"));
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": not a torch.save zip archive"});
  }
  SECTION("two optimizer files for one DP rank") {
    const std::string dir = CopyTag(tmp, "zero1");
    std::filesystem::copy_file(dir + "/" + Optim(0), dir + "/bf16_" + Optim(0));
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {": two optimizer files for DP rank 0 and mp rank 0 ("});
  }
  SECTION("mp_rank files with a gap") {
    const std::string dir = CopyTag(tmp, "zero1");
    std::filesystem::copy_file(dir + "/" + kModel, dir + "/mp_rank_02_model_states.pt");
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {": files of mp_rank 1 expected, found mp_rank up to 2"});
  }
  SECTION("checkpoint_parallel_dimensions naming more TP ranks than files") {
    const std::string dir = CopyTag(tmp, "zero1");
    Edit(dir + "/" + kModel, [](PV& root) {
      Set(At(root, "checkpoint_parallel_dimensions"), "tp_degree", PickleInt(2));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {": 1 mp_rank files do not split into 2 TP ranks per pipeline stage"});
  }
  SECTION("checkpoint_parallel_dimensions naming a pipeline the files lack") {
    const std::string dir = CopyTag(tmp, "zero1");
    Edit(dir + "/" + kModel, [](PV& root) {
      Set(At(root, "checkpoint_parallel_dimensions"), "pp_degree", PickleInt(2));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": checkpoint_parallel_dimensions says pp 2 x tp 1, the files "
             "are pp 1 x tp 1"});
  }
  SECTION("two pipeline stages without layer files") {
    const std::string dir = CopyTag(tmp, "tp2");
    for (const char* f : {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"}) {
      Edit(dir + "/" + f, [](PV& root) {
        Set(root, "checkpoint_parallel_dimensions",
            PickleDict({{"pp_degree", PickleInt(2)}, {"tp_degree", PickleInt(1)}}));
      });
    }
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {": pipeline degree 2 but no layer_XX-model_YY-model_states.pt files"});
  }
  SECTION("layer files of TP rank 1 only") {
    const std::string dir = CopyTag(tmp, "pp2_tp2");
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (n.starts_with("layer_") && n.find("-model_00-") != std::string::npos) {
        std::filesystem::remove(e.path());
      }
    }
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {": pipeline layer files of TP rank 0 expected, found model_1"});
  }
  SECTION("a directory without DeepSpeed files") {
    std::filesystem::create_directories(tmp.path() + "/empty");
    testing::WriteFileBytes(tmp.path() + "/empty/notes.txt", testing::AsBytes("x"));
    Refused(ReadDeepSpeedCheckpoint(tmp.path() + "/empty"), StatusCode::kNotFound,
            {"/empty: no DeepSpeed *_model_states.pt / *_optim_states.pt files"});
  }
}

TEST_CASE("deepspeed refusals: module states and param_shapes", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  SECTION("module that is not a dict") {
    const std::string dir = CopyTag(tmp, "zero1");
    Edit(dir + "/" + kModel, [](PV& root) { Set(root, "module", PickleList({PickleInt(1)})); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": module is ", ", expected a dict of tensors"});
  }
  SECTION("module None without pipeline layer files") {
    const std::string dir = CopyTag(tmp, "zero1");
    Edit(dir + "/" + kModel, [](PV& root) { Set(root, "module", PickleNone()); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": module is None, but there are no pipeline layer files"});
  }
  SECTION("a module key that is not a string") {
    const std::string dir = CopyTag(tmp, "zero1");
    Edit(dir + "/" + kModel, [](PV& root) {
      PV& module = At(root, "module");
      EntriesOf(module).emplace_back(PickleInt(5), testing::DeepCopy(At(module, "layer.bias")));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": module key 5"});
  }
  SECTION("a shared_params entry that is not alias: owner") {
    const std::string dir = CopyTag(tmp, "frozen_tied");
    Edit(dir + "/" + kModel, [](PV& root) {
      Set(At(root, "shared_params"), "head.weight", PickleInt(3));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": shared_params entry ", " is not alias: owner"});
  }
  SECTION("param_shapes that is not a list") {
    const std::string dir = CopyTag(tmp, "zero1");
    Edit(dir + "/" + kModel, [](PV& root) { Set(root, "param_shapes", PickleInt(5)); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": param_shapes is 5, expected a list of dicts"});
  }
  SECTION("a param_shapes group that is not a dict") {
    const std::string dir = CopyTag(tmp, "zero1");
    Edit(dir + "/" + kModel, [](PV& root) { Set(root, "param_shapes", PickleList({PickleInt(5)})); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {std::string(kModel) + ": param_shapes[0] is 5, expected a dict"});
  }
  SECTION("a tied layer saved again with another shape") {
    const std::string dir = CopyTag(tmp, "pp2");
    Edit(dir + "/layer_04-model_00-model_states.pt", [](PV& root) {
      SetView(At(root, "weight"), {4, 6}, {6, 1});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {"layer_04-model_00-model_states.pt: 'weight' (", ") is float16 [4, 6], an earlier "
             "layer file has float16 [6, 4]"});
  }
  SECTION("a layer file that is not a state dict") {
    const std::string dir = CopyTag(tmp, "pp2");
    Edit(dir + "/layer_02-model_00-model_states.pt", [](PV& root) {
      root = *PickleList({PickleInt(1)});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {"layer_02-model_00-model_states.pt: holds ", ", expected the layer's state dict"});
  }
  SECTION("an expert file that is not a state dict") {
    // moe (no ZeRO optimizer read): with moe_zero2 the expert count check refuses first
    // ("the expert files hold 3 experts ... an expert file is missing").
    const std::string dir = CopyTag(tmp, "moe");
    Edit(dir + "/layer_0_expert_1_mp_rank_00_model_states.pt", [](PV& root) {
      root = *PickleList({PickleInt(1)});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {"layer_0_expert_1_mp_rank_00_model_states.pt: holds ",
             ", expected the expert's state dict"});
  }
}

// --- Universal checkpoints ------------------------------------------------------------------
// ucp: zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt, each {'param': tensor, 'cat_dim': 0};
// layer.weight is [4, 4].

std::string CopyUcp(const testing::TempDir& tmp) {
  static int copies = 0;
  const std::string dir = tmp.path() + "/ucp_" + std::to_string(copies++);
  std::filesystem::copy(Fixture("ucp") + "/ckpt/global_step3_universal", dir,
                        std::filesystem::copy_options::recursive);
  return dir;
}

TEST_CASE("deepspeed refusals: universal checkpoint params", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  SECTION("an fp32.pt of another shape than param_shapes") {
    const std::string dir = CopyUcp(tmp);
    Edit(dir + "/zero/layer.weight/fp32.pt", [](PV& root) {
      SetView(At(root, "param"), {2, 8}, {8, 1});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {"zero/layer.weight/fp32.pt: param has shape [2, 8], param_shapes says [4, 4]"});
  }
  SECTION("an exp_avg.pt with fewer elements than param_shapes") {
    const std::string dir = CopyUcp(tmp);
    Edit(dir + "/zero/layer.weight/exp_avg.pt", [](PV& root) {
      SetView(At(root, "param"), {8}, {1});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {"zero/layer.weight/exp_avg.pt: param has shape [8], param_shapes says [4, 4]"});
  }
  SECTION("a param dir outside param_shapes whose exp_avg differs from its fp32") {
    const std::string dir = CopyUcp(tmp);
    std::filesystem::copy(dir + "/zero/layer.weight", dir + "/zero/extra.weight");
    Edit(dir + "/zero/extra.weight/exp_avg_sq.pt", [](PV& root) {
      SetView(At(root, "param"), {2, 8}, {8, 1});
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {"zero/extra.weight/exp_avg_sq.pt: shape [2, 8], fp32.pt has [4, 4]"});
  }
  SECTION("a state file without 'param'") {
    const std::string dir = CopyUcp(tmp);
    Edit(dir + "/zero/layer.weight/fp32.pt", [](PV& root) { Erase(root, "param"); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {"zero/layer.weight/fp32.pt: a dict without 'param'"});
  }
  SECTION("a param dir missing") {
    const std::string dir = CopyUcp(tmp);
    std::filesystem::remove_all(dir + "/zero/layer.weight");
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {"/zero/layer.weight/ is missing (param_shapes lists 'layer.weight')"});
  }
}

// Writes `value` over element `element` of the pickled tensor `t` (a view: its storage offset
// is added) in `z`, the records of its file.
template <typename T>
void SetElement(PV& t, ZipRecords& z, int64_t element, T value) {
  const int64_t offset = M(testing::TensorArgs(t).items[1]).int_value;
  std::vector<std::byte>& data = z.Get("/data/" + testing::StorageKey(t));
  const size_t at = static_cast<size_t>(offset + element) * sizeof(T);
  REQUIRE(at + sizeof(T) <= data.size());
  std::memcpy(data.data() + at, &value, sizeof(T));
}

// tp2_ucp (tp 2 x dp 2, universal_checkpoint_info, norm.weight [4] replicated): norm.weight
// lies at [18, 22) of DP rank 1's flat partition (fp32 master and Adam states) and is a view
// at storage offset 42 of the flat 16-bit buffer in the module states.
const char* kTp1Optim1 = "zero_pp_rank_1_mp_rank_01_optim_states.pt";
const char* kTp0Optim1 = "zero_pp_rank_1_mp_rank_00_optim_states.pt";

void SetMaster(const std::string& path, int64_t element, float value) {
  testing::RewriteTorchSave(path, [&](PV& root, ZipRecords& z) {
    SetElement(Singles(At(root, "optimizer_state_dict"), 0), z, element, value);
  });
}
void SetState(const std::string& path, const char* state, int64_t element, float value) {
  testing::RewriteTorchSave(path, [&](PV& root, ZipRecords& z) {
    PV& st = AtInt(At(At(At(root, "optimizer_state_dict"), "base_optimizer_state"), "state"), 0);
    SetElement(At(st, state), z, element, value);
  });
}
void SetModule(const std::string& path, const char* name, int64_t element, uint16_t bits) {
  testing::RewriteTorchSave(path, [&](PV& root, ZipRecords& z) {
    SetElement(At(At(root, "module"), name), z, element, bits);
  });
}

// Issues 29/34: a replicated param's TP copies (fp32 master, Adam states, 16-bit module
// weights) are compared; DeepSpeed's ds_to_universal asserts them equal, fc refuses too.
TEST_CASE("deepspeed refusals: TP copies of a replicated param that differ",
          "[deepspeed][refusals]") {
  testing::TempDir tmp;
  const std::string tail =
      "; fc exports one copy only, and DeepSpeed's ds_to_universal refuses such a checkpoint "
      "too (merge_tp_slices asserts the TP slices of a replicated param equal)";
  SECTION("fp32 master, in DP rank 1's flat partition") {
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    SetMaster(dir + "/" + kTp1Optim1, 20, 7.5f);
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {dir + ": 'norm.weight' (float32 [4]) is replicated across TP "
                   "(tp_replicated_parameter_patterns), but its TP copies differ: element 2 is ",
             " on TP rank 0 (" + std::string(kTp0Optim1) + ") and 7.5 (0x40f00000) on TP rank 1 (" +
                 kTp1Optim1 + ")" + tail});
  }
  SECTION("Adam exp_avg_sq") {
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    SetState(dir + "/" + kTp1Optim1, "exp_avg_sq", 21, 0.25f);
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {": 'optimizer.exp_avg_sq.norm.weight' (float32 [4]) is replicated across TP",
             "element 3 is ", " and 0.25 (0x3e800000) on TP rank 1 (" + std::string(kTp1Optim1)});
  }
  SECTION("16-bit module weight") {
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    SetModule(dir + "/mp_rank_01_model_states.pt", "norm.weight", 1, uint16_t{0x4780});
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {": 'module.norm.weight' (float16 [4]) is replicated across TP",
             "element 1 is ", " on TP rank 0 (mp_rank_00_model_states.pt) and 7.5 (0x4780) on "
                              "TP rank 1 (mp_rank_01_model_states.pt)"});
  }
  SECTION("pipeline layer file of TP rank 1") {
    const std::string dir = CopyTag(tmp, "pp2_tp2");
    testing::RewriteTorchSave(dir + "/layer_01-model_01-model_states.pt",
                              [](PV& root, ZipRecords& z) {
                                SetElement(At(root, "input_layernorm.weight"), z, 0,
                                           uint16_t{0xbc00});
                              });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {": 'module.1.input_layernorm.weight' (float16 [3]) is replicated across TP",
             "element 0 is ", " and -1 (0xbc00) on TP rank 1 (layer_01-model_01-model_states.pt)"});
  }
  SECTION("compared in pieces of 8 bytes: the difference in a later piece") {
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    SetState(dir + "/" + kTp1Optim1, "exp_avg", 21, 0.5f);
    DeepSpeedReadOptions o;
    o.replica_piece_bytes = 8;
    Refused(ReadDeepSpeedCheckpoint(dir, o), StatusCode::kDataLoss,
            {": 'optimizer.exp_avg.norm.weight' (float32 [4])", "element 3 is ",
             " and 0.5 (0x3f000000) on TP rank 1"});
  }
  SECTION("--source-layout: a tensor without an axis is compared too") {
    // TP rank 1 made a copy of TP rank 0 (every file), then one element of its fp32 master of
    // embed.weight [4, 3] (DP rank 0's partition, element 7 = index [2, 1]) changed; the
    // rules give no tensor an axis, so every tensor is replicated.
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    for (const char* f : {"mp_rank_@_model_states.pt", "zero_pp_rank_0_mp_rank_@_optim_states.pt",
                          "zero_pp_rank_1_mp_rank_@_optim_states.pt"}) {
      std::string from = f, to = f;
      from.replace(from.find('@'), 1, "00");
      to.replace(to.find('@'), 1, "01");
      std::filesystem::copy_file(dir + "/" + from, dir + "/" + to,
                                 std::filesystem::copy_options::overwrite_existing);
    }
    DeepSpeedReadOptions o;
    o.tp_axis = [](std::string_view) { return std::optional<int64_t>(); };
    o.tp_axis_origin = "layout.json";
    o.replica_piece_bytes = 8;  // [4, 3] fp32: 2 pieces a row
    auto equal = ReadDeepSpeedCheckpoint(dir, o);
    REQUIRE(equal.ok());
    CHECK(equal->FindTensor("embed.weight")->global_shape == Shape{4, 3});
    SetMaster(dir + "/zero_pp_rank_0_mp_rank_01_optim_states.pt", 7, -2.0f);
    Refused(ReadDeepSpeedCheckpoint(dir, o), StatusCode::kDataLoss,
            {": 'embed.weight' (float32 [4, 3]) is replicated across TP (no tensor_parallel axis "
             "for it in layout.json), but its TP copies differ: element 7 (index [2, 1]) is ",
             " on TP rank 0 (zero_pp_rank_0_mp_rank_00_optim_states.pt) and -2 (0xc0000000) on "
             "TP rank 1 (zero_pp_rank_0_mp_rank_01_optim_states.pt); fc exports one copy only "
             "(give it an axis if it is split across TP)"});
  }
  SECTION("--source-layout: a buffer without an axis whose copies differ stays per rank") {
    // tp2: norm.running_mean differs per TP rank; the rules split the params only.
    DeepSpeedReadOptions o;
    o.tp_axis = [](std::string_view name) {
      return name == "norm.running_mean" ? std::optional<int64_t>() : std::optional<int64_t>(0);
    };
    o.tp_axis_origin = "layout.json";
    auto r = ReadDeepSpeedCheckpoint(Fixture("tp2") + "/ckpt", o);
    REQUIRE(r.ok());
    CHECK(r->FindTensor("norm.running_mean") == nullptr);
    CHECK(r->FindTensor("mp_rank_01.norm.running_mean")->global_shape == Shape{4});
    CHECK(r->FindTensor("module.mp_rank_00.norm.running_mean") != nullptr);
    CHECK(r->FindTensor("layer.weight")->global_shape == Shape{4, 4});
    CHECK_THAT(r->attributes.at("deepspeed.tp_buffers_per_rank"),
               Catch::Contains("norm.running_mean (values differ between TP rank 0 and TP rank "
                               "1: element 0 is "));
  }
}

TEST_CASE("deepspeed: equal TP replicas export, buffers that differ stay per rank",
          "[deepspeed][refusals]") {
  testing::TempDir tmp;
  SECTION("the same new value on both TP ranks") {
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    SetMaster(dir + "/" + kTp0Optim1, 20, 7.5f);
    SetMaster(dir + "/" + kTp1Optim1, 20, 7.5f);
    auto r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(r.ok());
    const TensorEntry* t = r->FindTensor("norm.weight");
    REQUIRE(t != nullptr);
    float v[4] = {0, 0, 0, 0};
    ChunkReader reader(*r);
    for (const Chunk& c : t->chunks) {
      REQUIRE(reader.CopyChunkRegion(*t, c, Box::Whole({4}), v, Box::Whole({4})).ok());
    }
    CHECK(v[2] == 7.5f);
  }
  SECTION("+0 and -0 are equal (torch.equal)") {
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    SetMaster(dir + "/" + kTp0Optim1, 19, 0.0f);
    SetMaster(dir + "/" + kTp1Optim1, 19, -0.0f);
    CHECK(ReadDeepSpeedCheckpoint(dir).ok());
  }
  SECTION("a buffer matching the replicated pattern: per rank when its copies differ") {
    // ds_to_universal never compares buffers (it keeps the first mp_rank file's): fc keeps
    // the copies per rank with a note (deepspeed.tp_buffers_per_rank), as for other buffers.
    const std::string dir = CopyTag(tmp, "tp2_buffers");
    SetModule(dir + "/mp_rank_01_model_states.pt", "norm.running_mean", 3, uint16_t{0x4780});
    auto r = ReadDeepSpeedCheckpoint(dir);
    REQUIRE(r.ok());
    CHECK(r->FindTensor("norm.running_mean") == nullptr);
    CHECK(r->FindTensor("mp_rank_01.norm.running_mean") != nullptr);
    CHECK(r->FindTensor("module.mp_rank_00.norm.running_mean") != nullptr);
    CHECK_THAT(r->attributes.at("deepspeed.tp_buffers_per_rank"),
               Catch::Contains("norm.running_mean (values differ between TP rank 0 and TP rank "
                               "1: element 3 is "));
  }
}

TEST_CASE("deepspeed refusals: --weights", "[deepspeed][refusals]") {
  auto w = ParseDeepSpeedWeights("bf16");
  REQUIRE_FALSE(w.ok());
  CHECK(w.status().code() == StatusCode::kInvalidArgument);
  CHECK(w.status().message() == "unknown --weights 'bf16' (expected fp32 or module)");
  CheckpointIndex other;
  other.format = CheckpointFormat::kSafetensors;
  Status s = SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &other);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::StartsWith("--weights applies to DeepSpeed checkpoints only "
                                            "(input is "));
}


// --- universal_checkpoint_info: the TP merge rules (issue 34) ----------------------------
// tp2_ucp's mp_rank_00_model_states.pt carries UCP_INFO (testdata/gen/deepspeed/gen.py):
// embed.weight a vocabulary param (original_vocab_size 7 of 8 rows), norm.* replicated,
// dense.weight row-parallel, mlp.h_to_4h.weight two sub-params cat on dim 0.
void EditInfo(const std::string& dir, const std::function<void(PV&)>& edit) {
  Edit(dir + "/" + kModel, [&](PV& root) { edit(At(root, "universal_checkpoint_info")); });
}
PV::Ptr SubParams(std::vector<PV::Ptr> patterns, PV::Ptr shape, PV::Ptr partition_dim) {
  return PickleDict({{"patterns", PickleList(std::move(patterns))},
                     {"shape", std::move(shape)},
                     {"partition_dim", std::move(partition_dim)}});
}

TEST_CASE("deepspeed refusals: universal_checkpoint_info", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  auto refused = [&](const std::function<void(PV&)>& edit, StatusCode code,
                     std::initializer_list<std::string_view> parts) {
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    EditInfo(dir, edit);
    Refused(ReadDeepSpeedCheckpoint(dir), code, parts);
  };
  const std::string info = std::string(kModel) + ": universal_checkpoint_info['";
  SECTION("a pattern list that is not a list") {
    refused([](PV& i) { Set(i, "tp_replicated_parameter_patterns", PickleInt(5)); },
            StatusCode::kDataLoss,
            {info + "tp_replicated_parameter_patterns'] is 5, expected a list of patterns"});
  }
  SECTION("a pattern that is not a string") {
    refused([](PV& i) { Set(i, "parameter_with_row_parallelism_patterns",
                            PickleList({PickleInt(3)})); },
            StatusCode::kDataLoss,
            {info + "parameter_with_row_parallelism_patterns'] entry 3 is not a string"});
  }
  SECTION("a pattern RE2 does not run (a backreference)") {
    refused([](PV& i) { Set(i, "vocabulary_parameter_patterns",
                            PickleList({PickleStr("(embed)\\1")})); },
            StatusCode::kUnimplemented,
            {info + "vocabulary_parameter_patterns'] pattern '(embed)\\1' is not a regular "
                    "expression fc runs"});
  }
  SECTION("parameter_with_sub_params: an entry without patterns") {
    refused([](PV& i) { Set(i, "parameter_with_sub_params",
                            PickleList({PickleDict({{"shape", PickleIntTuple({2, 4})}})})); },
            StatusCode::kDataLoss, {info + "parameter_with_sub_params'] entry", "has no patterns list"});
  }
  SECTION("parameter_with_sub_params: a pattern that is not a string") {
    refused([](PV& i) { Set(i, "parameter_with_sub_params",
                            PickleList({SubParams({PickleInt(1)}, PickleIntTuple({2, 4}),
                                                  PickleInt(0))})); },
            StatusCode::kDataLoss, {std::string(kModel) + ": sub-param pattern 1"});
  }
  SECTION("parameter_with_sub_params: partition_dim outside the shape") {
    refused([](PV& i) { Set(i, "parameter_with_sub_params",
                            PickleList({SubParams({PickleStr("x")}, PickleIntTuple({2, 4}),
                                                  PickleInt(2))})); },
            StatusCode::kDataLoss,
            {"shape must be a non-empty tuple and partition_dim one of its dims"});
  }
  SECTION("parameter_with_sub_params: an empty shape") {
    refused([](PV& i) { Set(i, "parameter_with_sub_params",
                            PickleList({SubParams({PickleStr("x")}, PickleIntTuple({}),
                                                  PickleInt(0))})); },
            StatusCode::kDataLoss,
            {"shape must be a non-empty tuple and partition_dim one of its dims"});
  }
  SECTION("parameter_with_sub_params: a negative shape entry") {
    refused([](PV& i) { Set(i, "parameter_with_sub_params",
                            PickleList({SubParams({PickleStr("x")}, PickleIntTuple({-2, 4}),
                                                  PickleInt(0))})); },
            StatusCode::kDataLoss, {"parameter_with_sub_params'] entry", ": shape entry -2"});
  }
  SECTION("parameter_with_sub_params: a shape entry that is neither a size nor sizes") {
    refused([](PV& i) { Set(i, "parameter_with_sub_params",
                            PickleList({SubParams({PickleStr("x")},
                                                  PickleTuple({PickleStr("2"), PickleInt(4)}),
                                                  PickleInt(0))})); },
            StatusCode::kDataLoss, {": shape entry '2'"});
  }
  SECTION("parameter_with_sub_params: a negative sub-param size") {
    refused([](PV& i) { Set(i, "parameter_with_sub_params",
                            PickleList({SubParams({PickleStr("x")},
                                                  PickleTuple({PickleIntTuple({2, -1}),
                                                               PickleInt(4)}),
                                                  PickleInt(0))})); },
            StatusCode::kDataLoss, {": sub-param size -1"});
  }
  SECTION("sub_param_shard_widths that is not a dict") {
    refused([](PV& i) { Set(i, "sub_param_shard_widths", PickleList({})); },
            StatusCode::kDataLoss,
            {info + "sub_param_shard_widths'] is [], expected a dict pattern -> widths"});
  }
  SECTION("sub_param_shard_widths with a negative width") {
    refused([](PV& i) {
              Set(i, "sub_param_shard_widths",
                  PickleDict({{"x", PickleList({PickleList({PickleInt(2), PickleInt(-1)})})}}));
            },
            StatusCode::kDataLoss,
            {info + "sub_param_shard_widths'] entry 'x'",
             "is not pattern: [[width per TP rank] per sub-param]"});
  }
  SECTION("a negative original_vocab_size") {
    refused([](PV& i) { Set(i, "original_vocab_size", PickleInt(-1)); },
            StatusCode::kDataLoss, {info + "original_vocab_size'] is -1"});
  }
  SECTION("autotp_unsupported_parameter_patterns listed") {
    refused([](PV& i) { Set(i, "autotp_unsupported_parameter_patterns",
                            PickleDict({{"lm_head", PickleStr("fused")}})); },
            StatusCode::kUnimplemented,
            {"universal_checkpoint_info lists autotp_unsupported_parameter_patterns",
             "(DeepSpeed refuses to merge this checkpoint too)"});
  }
  SECTION("a vocabulary param without original_vocab_size") {
    refused([](PV& i) { Erase(i, "original_vocab_size"); }, StatusCode::kDataLoss,
            {"vocabulary_parameter_patterns matches 'embed.weight' but universal_checkpoint_info "
             "has no original_vocab_size"});
  }
  SECTION("original_vocab_size past the merged rows") {
    refused([](PV& i) { Set(i, "original_vocab_size", PickleInt(9)); }, StatusCode::kDataLoss,
            {"original_vocab_size 9 exceeds the 8 merged rows of 'embed.weight'"});
  }
}

// --- legacy (non-zip) torch.save: the header pickles and the storage list (issue 34) -------
// The legacy fixture's files: five protocol-2 pickles (magic number, protocol version 1001,
// sys_info, the object, the storage keys), then per key an int64 element count and the bytes.
struct LegacyFile {
  std::vector<std::vector<std::byte>> pickles;  // the five, as written
  std::vector<std::byte> data;                  // everything after them
};
LegacyFile SplitLegacy(const std::string& path) {
  const std::vector<std::byte> bytes = testing::ReadFileBytes(path);
  LegacyFile f;
  size_t pos = 0;
  for (int i = 0; i < 5; ++i) {
    size_t used = 0;
    auto v = ParsePickle(std::span(bytes).subspan(pos), PickleLimits{}, &used);
    REQUIRE(v.ok());
    f.pickles.emplace_back(bytes.begin() + static_cast<std::ptrdiff_t>(pos),
                           bytes.begin() + static_cast<std::ptrdiff_t>(pos + used));
    pos += used;
  }
  f.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(pos), bytes.end());
  return f;
}
void JoinLegacy(const std::string& path, const LegacyFile& f) {
  std::vector<std::byte> out;
  for (const auto& p : f.pickles) out.insert(out.end(), p.begin(), p.end());
  out.insert(out.end(), f.data.begin(), f.data.end());
  testing::WriteFileBytes(path, out);
}
TEST_CASE("deepspeed refusals: legacy torch.save", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  const std::string file = "zero_pp_rank_1_mp_rank_00_optim_states.pt";
  auto refused = [&](const std::function<void(LegacyFile&)>& edit, StatusCode code,
                     std::initializer_list<std::string_view> parts) {
    const std::string dir = CopyTag(tmp, "legacy");
    LegacyFile f = SplitLegacy(dir + "/" + file);
    edit(f);
    JoinLegacy(dir + "/" + file, f);
    auto r = ReadDeepSpeedCheckpoint(dir);
    Refused(r, code, parts);
    if (!r.ok()) CHECK_THAT(r.status().message(), Catch::Contains(file));
  };
  // the storage list's first key and the data region's first element count
  auto first_key = [](const LegacyFile& f) {
    auto keys = ParsePickle(f.pickles[4]);
    REQUIRE(keys.ok());
    REQUIRE_FALSE(keys->items.empty());
    return keys->items[0]->str;
  };
  SECTION("another magic number") {
    refused([](LegacyFile& f) {
              REQUIRE(f.pickles[0].size() == 15);  // PROTO 2, LONG1 10 bytes, STOP
              f.pickles[0][5] ^= std::byte{0x01};
            },
            StatusCode::kDataLoss, {"legacy torch.save magic number is"});
  }
  SECTION("another protocol version") {
    refused([](LegacyFile& f) { f.pickles[1] = EncodePickle(*PickleInt(1002)); },
            StatusCode::kUnimplemented, {"legacy torch.save protocol version 1002 (fc reads 1001)"});
  }
  SECTION("written on a big-endian machine") {
    refused([](LegacyFile& f) {
              auto info = ParsePickle(f.pickles[2]);
              REQUIRE(info.ok());
              PV::Ptr copy = testing::DeepCopy(*info);
              Set(M(copy), "little_endian", PickleBool(false));
              f.pickles[2] = EncodePickle(*copy);
            },
            StatusCode::kUnimplemented, {"legacy torch.save written on a big-endian machine"});
  }
  SECTION("a storage key list that is not a list") {
    refused([](LegacyFile& f) { f.pickles[4] = EncodePickle(*PickleInt(5)); },
            StatusCode::kDataLoss, {"legacy torch.save storage key list is 5"});
  }
  SECTION("a storage key that is not a string") {
    refused([](LegacyFile& f) { f.pickles[4] = EncodePickle(*PickleList({PickleInt(7)})); },
            StatusCode::kDataLoss, {"legacy torch.save storage key 7"});
  }
  SECTION("a storage key no tensor uses") {
    refused([](LegacyFile& f) {
              f.pickles[4] = EncodePickle(*PickleList({PickleStr("nobody")}));
            },
            StatusCode::kDataLoss, {"legacy torch.save storage 'nobody' is used by no tensor"});
  }
  SECTION("the data ends before a storage's element count") {
    refused([](LegacyFile& f) { f.data.resize(4); },
            StatusCode::kDataLoss, {"starts past the end"});
  }
  SECTION("an element count that disagrees with the pickle's storage size") {
    refused([](LegacyFile& f) {
              REQUIRE(f.data.size() >= 8);
              f.data[0] = static_cast<std::byte>(static_cast<uint8_t>(f.data[0]) + 1);
            },
            StatusCode::kDataLoss, {"elements of 4 bytes, the pickle says"});
  }
  SECTION("a tensor whose storage the list leaves out") {
    refused([&](LegacyFile& f) {
              auto keys = ParsePickle(f.pickles[4]);
              REQUIRE(keys.ok());
              REQUIRE(keys->items.size() >= 2);
              f.pickles[4] = EncodePickle(*PickleList({PickleStr(first_key(f))}));
            },
            StatusCode::kDataLoss, {"' is not in the file's storage list"});
  }
  SECTION("a storage listed twice") {
    // the list names its first key twice: the second time the count read is the next
    // storage's, so a list of one key repeated over a file of one storage is built instead
    refused([&](LegacyFile& f) {
              const std::string key = first_key(f);
              f.pickles[4] = EncodePickle(*PickleList({PickleStr(key), PickleStr(key)}));
              // the first storage's count and bytes, twice
              auto count = std::vector<std::byte>(f.data.begin(), f.data.begin() + 8);
              uint64_t numel = 0;
              for (int b = 7; b >= 0; --b) numel = (numel << 8) | static_cast<uint64_t>(count[b]);
              const size_t bytes = 8 + static_cast<size_t>(numel) * 4;
              REQUIRE(f.data.size() >= bytes);
              std::vector<std::byte> one(f.data.begin(),
                                         f.data.begin() + static_cast<std::ptrdiff_t>(bytes));
              f.data = one;
              f.data.insert(f.data.end(), one.begin(), one.end());
            },
            StatusCode::kDataLoss, {"' listed twice"});
  }
}

// --- TP merge by universal_checkpoint_info (issue 34) --------------------------------------
// tp2_ucp's TP rank 1 (mp_rank_01_model_states.pt) edited: its 16-bit module weights are the
// TP slices merged with rank 0's (module.layer.weight [2, 4] per rank, cat on dim 0).
const char* kTp1Model = "mp_rank_01_model_states.pt";

TEST_CASE("deepspeed refusals: TP slices that do not merge", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  auto refused = [&](const char* file, const std::function<void(PV&)>& edit, StatusCode code,
                     std::initializer_list<std::string_view> parts) {
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    Edit(dir + "/" + file, edit);
    Refused(ReadDeepSpeedCheckpoint(dir), code, parts);
  };
  SECTION("a row-parallel pattern matching a 1-d param") {
    refused(kModel, [](PV& root) {
              Set(At(root, "universal_checkpoint_info"), "parameter_with_row_parallelism_patterns",
                  PickleList({PickleStr("layer\\.bias")}));
            },
            StatusCode::kDataLoss,
            {"'layer.bias' has shape [2], its TP slices cannot be concatenated along dim 1 "
             "(row-parallel pattern in mp_rank_00_model_states.pt)"});
  }
  SECTION("a module weight TP rank 1 lacks") {
    refused(kTp1Model, [](PV& root) { Erase(At(root, "module"), "layer.bias"); },
            StatusCode::kDataLoss,
            {"tensor 'module.layer.bias' of TP rank 0 is absent from TP rank 1"});
  }
  SECTION("a module weight under another name on TP rank 1") {
    refused(kTp1Model, [](PV& root) {
              PV& module = At(root, "module");
              PV::Ptr bias = *testing::Slot(module, "layer.bias");
              Erase(module, "layer.bias");
              Set(module, "layer.bias_renamed", bias);
            },
            StatusCode::kDataLoss,
            {"tensor 'layer.bias_renamed' of TP rank 1 is absent from TP rank 0"});
  }
  SECTION("a module weight of another rank on TP rank 1") {
    refused(kTp1Model, [](PV& root) { SetView(At(At(root, "module"), "layer.weight"), {8}, {1}); },
            StatusCode::kDataLoss,
            {"tensor 'module.layer.weight' is float16 [2, 4] on TP rank 0 but float16 [8] on TP "
             "rank 1"});
  }
  SECTION("TP slices that differ off the concatenated dim") {
    refused(kTp1Model,
            [](PV& root) { SetView(At(At(root, "module"), "layer.weight"), {4, 2}, {2, 1}); },
            StatusCode::kDataLoss,
            {"TP slices of 'module.layer.weight' (concatenated along dim 0) are [2, 4] on TP "
             "rank 0 and [4, 2] on TP rank 1"});
  }
}

// --- MoE expert files, pipeline layer files, missing model states, export selection -------
TEST_CASE("deepspeed refusals: expert and layer files and model states", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  const std::string expert0 = "layer_0_expert_0_mp_rank_00_model_states.pt";
  const std::string expert1 = "layer_0_expert_1_mp_rank_00_model_states.pt";
  // a copy of the first tensor value of a dict
  auto first_value = [](PV& d) { return EntriesOf(d).front().second; };
  SECTION("an expert file key that is not a string") {
    const std::string dir = CopyTag(tmp, "moe");
    Edit(dir + "/" + expert0, [&](PV& root) {
      EntriesOf(root).emplace_back(PickleInt(3), first_value(root));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {expert0 + ": state dict key 3"});
  }
  SECTION("a tensor in two expert files") {
    const std::string dir = CopyTag(tmp, "moe");
    Edit(dir + "/" + expert1, [&](PV& root) {
      Set(root, "moe.deepspeed_moe.experts.deepspeed_experts.0.fc.bias",
          *testing::Slot(root, "moe.deepspeed_moe.experts.deepspeed_experts.1.fc.bias"));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {": 'moe.deepspeed_moe.experts.deepspeed_experts.0.fc.bias' is also in another model "
             "states or expert file"});
  }
  SECTION("an MoE tag dir without mp_rank_00_model_states.pt") {
    const std::string dir = CopyTag(tmp, "moe");
    std::filesystem::remove(dir + "/" + kModel);
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {dir + ": mp_rank_00_model_states.pt is missing (the dir holds expert files of a "
                   "DeepSpeed save, but no mp_rank_XX_model_states.pt or *_optim_states.pt)"});
  }
  SECTION("a ZeRO-2 tag dir without mp_rank_00_model_states.pt") {
    const std::string dir = CopyTag(tmp, "zero2");
    std::filesystem::remove(dir + "/" + kModel);
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {dir + ": mp_rank_00_model_states.pt is missing"});
  }
  SECTION("a pipeline layer file key that is not a string") {
    const std::string dir = CopyTag(tmp, "pp2");
    Edit(dir + "/layer_01-model_00-model_states.pt", [&](PV& root) {
      EntriesOf(root).emplace_back(PickleInt(5), first_value(root));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {"layer_01-model_00-model_states.pt: state dict key 5"});
  }
  SECTION("a tied weight of another shape in a later layer file") {
    const std::string dir = CopyTag(tmp, "pp2");
    Edit(dir + "/layer_04-model_00-model_states.pt",
         [&](PV& root) { SetView(At(root, "weight"), {4, 6}, {6, 1}); });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss,
            {"layer_04-model_00-model_states.pt: 'weight' (tied_modules.embed.weight) is float16 "
             "[4, 6], an earlier layer file has float16 [6, 4]"});
  }
  SECTION("an MoE optimizer file alone") {
    const std::string dir = CopyTag(tmp, "moe");
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (!e.path().filename().string().starts_with("expp_rank_")) std::filesystem::remove(e.path());
    }
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {dir + ": mp_rank_00_model_states.pt is missing (the dir holds MoE optimizer files"});
  }
  SECTION("pipeline layer files without the model states") {
    const std::string dir = CopyTag(tmp, "pp2");
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (!e.path().filename().string().starts_with("layer_")) std::filesystem::remove(e.path());
    }
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kNotFound,
            {dir + ": mp_rank_00_model_states.pt is missing (the dir holds pipeline layer files"});
  }
}

TEST_CASE("deepspeed refusals: export weight selection", "[deepspeed][refusals]") {
  SECTION("TP shards and no universal_checkpoint_info") {
    auto index = ReadDeepSpeedCheckpoint(Fixture("tp2") + "/ckpt");
    REQUIRE(index.ok());
    Status s = SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &*index);
    CHECK(s.code() == StatusCode::kUnimplemented);
    CHECK_THAT(s.message(), Catch::Contains(
                                "DeepSpeed checkpoint with tensor parallelism (tp_degree 2) but no "
                                "universal_checkpoint_info in its model states: nothing says how "
                                "the TP shards concatenate"));
  }
  SECTION("MoE fp32 master weights") {
    auto index = ReadDeepSpeedCheckpoint(Fixture("moe") + "/ckpt");
    REQUIRE(index.ok());
    Status s = SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &*index);
    CHECK(s.code() == StatusCode::kUnimplemented);
    CHECK_THAT(s.message(), Catch::Contains(
                                "MoE DeepSpeed checkpoint: fc reads its 16-bit module and expert "
                                "weights only (its optimizer files, which hold the fp32 master "
                                "weights, are not read); export with --weights module"));
    CHECK(SelectDeepSpeedWeights(DeepSpeedWeights::kModule, &*index).ok());
  }
  SECTION("TP shards fc keeps per rank") {
    auto index = ReadDeepSpeedCheckpoint(Fixture("tp2_avg") + "/ckpt");
    REQUIRE(index.ok());
    REQUIRE(index->attributes.count("deepspeed.tp_unmerged") == 1);
    Status s = SelectDeepSpeedWeights(DeepSpeedWeights::kFp32, &*index);
    CHECK(s.code() == StatusCode::kUnimplemented);
    CHECK_THAT(s.message(), Catch::Contains("DeepSpeed TP shards that fc does not merge: " +
                                            index->attributes.at("deepspeed.tp_unmerged") +
                                            "; export refused"));
  }
}

// parameter_with_sub_params applied: tp2_ucp's mlp.h_to_4h.weight ([4, 3] per TP rank, [8, 3]
// merged) given a SubparamShape instead of its 2-sub-params rule.
TEST_CASE("deepspeed refusals: sub-param merges", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  const std::string pattern = "mlp\\.h_to_4h\\.weight";
  auto refused = [&](double version, PV::Ptr shape, int64_t partition_dim, PV::Ptr widths,
                     StatusCode code, std::initializer_list<std::string_view> parts) {
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    EditInfo(dir, [&](PV& i) {
      Erase(i, "parameter_with_2_sub_params_cat_dim_0");
      Set(i, "universal_checkpoint_version", PickleFloat(version));
      Set(i, "parameter_with_sub_params",
          PickleList({SubParams({PickleStr(pattern)}, shape, PickleInt(partition_dim))}));
      if (widths) Set(i, "sub_param_shard_widths", PickleDict({{pattern, widths}}));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), code, parts);
  };
  auto ints = [](std::vector<std::vector<int64_t>> rows) {
    std::vector<PV::Ptr> out;
    for (const auto& r : rows) {
      std::vector<PV::Ptr> row;
      for (int64_t v : r) row.push_back(PickleInt(v));
      out.push_back(PickleList(std::move(row)));
    }
    return PickleList(std::move(out));
  };
  const std::string where = std::string(kModel) + ": parameter_with_sub_params pattern '" +
                            pattern + "' for '";
  SECTION("a partition_dim the TP slices lack") {
    refused(0.4, PickleIntTuple({8, 3, 1}), 2, nullptr, StatusCode::kUnimplemented,
            {where, "': the TP slice [4, 3] has no dim 2 to size the sub-params by"});
  }
  SECTION("version 0.4 with a count, not sizes, at partition_dim") {
    refused(0.4, PickleIntTuple({2, 3}), 0, nullptr, StatusCode::kDataLoss,
            {where, "universal_checkpoint_version 0.4", "needs the sub-param sizes (a tuple) at "
                                                        "partition_dim 0"});
  }
  SECTION("version 0.4 without shard widths for the pattern") {
    refused(0.4, PickleTuple({PickleIntTuple({4, 4}), PickleInt(3)}), 0, nullptr,
            StatusCode::kDataLoss,
            {where, "but sub_param_shard_widths has no entry for the pattern"});
  }
  SECTION("before 0.4: a count that does not divide the merged dim") {
    refused(0.3, PickleIntTuple({3, 3}), 0, nullptr, StatusCode::kDataLoss,
            {where, ": 3 sub-params do not divide the 8 merged entries of dim 0"});
  }
  SECTION("before 0.4: a sub-param size the TP degree does not divide") {
    refused(0.3, PickleTuple({PickleIntTuple({3, 5}), PickleInt(3)}), 0, nullptr,
            StatusCode::kUnimplemented,
            {where, ": sub-param size 3 is not divisible by the TP degree 2",
             "records no sub_param_shard_widths: the uneven layout is unknown"});
  }
  SECTION("shard widths for fewer sub-params") {
    refused(0.4, PickleTuple({PickleIntTuple({4, 4}), PickleInt(3)}), 0, ints({{2, 2}}),
            StatusCode::kDataLoss, {where, ": 1 shard width lists for 2 sub-params"});
  }
  SECTION("shard widths that do not sum to the sub-param") {
    refused(0.4, PickleTuple({PickleIntTuple({4, 4}), PickleInt(3)}), 0, ints({{2, 2}, {3, 2}}),
            StatusCode::kDataLoss,
            {where, ": sub-param 1 of size 4 has shard widths summing to 5 over 2 ranks, "
                    "expected 2"});
  }
  SECTION("TP slices larger than the sub-param shape") {
    refused(0.4, PickleTuple({PickleIntTuple({2, 2}), PickleInt(3)}), 0, ints({{1, 1}, {1, 1}}),
            StatusCode::kDataLoss,
            {where, ": TP rank 0 holds [4, 3], the sub-param shape with its widths is [2, 3]"});
  }
  SECTION("TP slices of the sub-param's count in another shape") {
    refused(0.4, PickleTuple({PickleIntTuple({2, 2}), PickleInt(6)}), 0, ints({{1, 1}, {1, 1}}),
            StatusCode::kUnimplemented,
            {where, ": TP rank 0 holds [4, 3], the sub-param shape with its widths is [2, 6] "
                    "(fc merges a sub-param view of the slice's own shape only)"});
  }
}

// --source-layout's tensor_parallel rules (DeepSpeedReadOptions::tp_axis) on tp2 (TP 2, no
// universal_checkpoint_info): TP rank 1's module states edited.
TEST_CASE("deepspeed refusals: TP merge by --source-layout rules", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  DeepSpeedReadOptions o;
  o.tp_axis = [](std::string_view name) {
    return name == "norm.running_mean" ? std::optional<int64_t>() : std::optional<int64_t>(0);
  };
  o.tp_axis_origin = "layout.json";
  auto read = [&](const std::function<void(PV&)>& edit) {
    const std::string dir = CopyTag(tmp, "tp2");
    Edit(dir + "/" + kTp1Model, edit);
    return ReadDeepSpeedCheckpoint(dir, o);
  };
  SECTION("TP rank 1 holds one more module tensor") {
    Refused(read([](PV& root) {
              PV& module = At(root, "module");
              Set(module, "extra.weight", *testing::Slot(module, "layer.bias"));
            }),
            StatusCode::kDataLoss, {"TP rank 1 holds ", " tensors of a kind where TP rank 0 holds "});
  }
  SECTION("a param TP rank 1 names otherwise (module, param_shapes, param_slice_mappings)") {
    auto rename = [](PV& d) {
      for (auto& [k, v] : EntriesOf(d)) {
        if (k && k->kind == PV::Kind::kStr && k->str == "layer.bias") {
          k = PickleStr("layer.bias_renamed");
        }
      }
    };
    const std::string dir = CopyTag(tmp, "tp2");
    Edit(dir + "/" + kTp1Model, [&](PV& root) {
      rename(At(root, "module"));
      for (auto& g : At(root, "param_shapes").items) rename(M(g));
    });
    for (const char* f : {"zero_pp_rank_0_mp_rank_01_optim_states.pt", kTp1Optim1}) {
      EditOsd(dir + "/" + f, [&](PV& osd) {
        for (auto& g : At(osd, "param_slice_mappings").items) rename(M(g));
      });
    }
    Refused(ReadDeepSpeedCheckpoint(dir, o), StatusCode::kDataLoss,
            {"tensor 'layer.bias' of TP rank 0 is absent from TP rank 1"});
  }
  SECTION("a slice of another rank on TP rank 1") {
    Refused(read([](PV& root) { SetView(At(At(root, "module"), "layer.weight"), {8}, {1}); }),
            StatusCode::kDataLoss,
            {"tensor 'module.layer.weight' is float16 [2, 4] on TP rank 0 but float16 [8] on TP "
             "rank 1"});
  }
}

// parameter_with_sub_params entries past the reader's bounds (65536 dims, 65536 sub-params):
// refused before anything is sized from them.
TEST_CASE("deepspeed refusals: sub-param shapes past the bounds", "[deepspeed][refusals]") {
  testing::TempDir tmp;
  auto refused = [&](PV::Ptr shape, std::string_view words) {
    const std::string dir = CopyTag(tmp, "tp2_ucp");
    EditInfo(dir, [&](PV& i) {
      Set(i, "parameter_with_sub_params",
          PickleList({SubParams({PickleStr("x")}, shape, PickleInt(0))}));
    });
    Refused(ReadDeepSpeedCheckpoint(dir), StatusCode::kDataLoss, {words});
  };
  SECTION("65537 dims") { refused(PickleIntTuple(std::vector<int64_t>(65537, 1)), ": shape too long"); }
  SECTION("65537 sub-params") {
    refused(PickleTuple({PickleIntTuple(std::vector<int64_t>(65537, 1)), PickleInt(3)}),
            ": too many sub-params");
  }
}

}  // namespace
}  // namespace fc
