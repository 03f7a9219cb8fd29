// Test helpers for the torch readers: fixtures, .npy files, tensor reassembly from a
// CheckpointIndex, byte patching, and a pickle writer that builds
// DCP `.metadata` files (both torch generations, both enum forms, arbitrary damage).
#ifndef FC_TESTS_FORMAT_TORCH_TORCH_TEST_SUPPORT_H_
#define FC_TESTS_FORMAT_TORCH_TORCH_TEST_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "fc/format/torch_dcp.h"
#include "tests/support/file_util.h"
#include "tests/support/temp_dir.h"

namespace fc::testing {

// $FC_TESTDATA/torch_dcp/<name> (the fixture root, holding ckpt/ and expected/).
std::string TorchFixture(const std::string& name);

// The bytes of the torch.save archive holding the first chunk of tensor `fqn` of fixture
// `fixture` (cut out of its .distcp file at the offset its .metadata gives).
std::vector<std::byte> DcpFixtureItem(const std::string& fixture, const std::string& fqn);

std::vector<std::byte> AsBytes(std::string_view s);
// "80 02 4b 07 2e" or "80024b072e" -> bytes.
std::vector<std::byte> Hex(std::string_view hex);

// First position of `needle` in `hay` at or after `from`, or npos.
size_t FindBytes(std::span<const std::byte> hay, std::span<const std::byte> needle,
                 size_t from = 0);

// A parsed .npy file (format 1.0-3.0, C order).
struct NpyArray {
  std::string descr;  // e.g. "<f4"
  Shape shape;
  std::vector<std::byte> data;
};
NpyArray ReadNpy(const std::string& path);

// The full row-major value of `tensor`, assembled from its chunks by reading the files of
// `index` and copying with fc::CopyRegion (honouring strides). Fails the current test if a
// chunk's byte_length disagrees with its layout, if any element is not covered exactly
// once by the chunks with replica_id 0, or if a replica's bytes differ from theirs.
std::vector<std::byte> ReassembleTensor(const CheckpointIndex& index, const TensorEntry& tensor);

// --- Writing pickles ---------------------------------------------------------------------

// Emits pickle opcodes; every method appends one opcode (with operand).
class PickleWriter {
 public:
  PickleWriter& Proto(uint8_t p);
  PickleWriter& Frame(uint64_t n);
  PickleWriter& Mark();
  PickleWriter& Stop();
  PickleWriter& None();
  PickleWriter& Bool(bool b);
  PickleWriter& Int(int64_t v);                 // smallest of BININT1/2, BININT, LONG1
  PickleWriter& Long1(std::span<const uint8_t> le_bytes);
  PickleWriter& Float(double v);                // BINFLOAT
  PickleWriter& Str(std::string_view s);        // BINUNICODE
  PickleWriter& ShortStr(std::string_view s);   // SHORT_BINUNICODE
  PickleWriter& Global(std::string_view module, std::string_view name);       // GLOBAL
  PickleWriter& StackGlobal(std::string_view module, std::string_view name);  // 2 strs + 0x93
  PickleWriter& EmptyTuple();
  PickleWriter& EmptyList();
  PickleWriter& EmptyDict();
  PickleWriter& Tuple();  // TUPLE (from the mark)
  PickleWriter& Tuple1();
  PickleWriter& Tuple2();
  PickleWriter& Append();
  PickleWriter& Appends();
  PickleWriter& SetItem();
  PickleWriter& SetItems();
  PickleWriter& Reduce();
  PickleWriter& NewObj();
  PickleWriter& Build();
  PickleWriter& BinPersId();
  PickleWriter& Memoize();
  PickleWriter& BinPut(uint8_t i);
  PickleWriter& BinGet(uint8_t i);
  PickleWriter& Op(uint8_t op);
  PickleWriter& Raw(std::span<const std::byte> bytes);

  // torch.Size((d0, ...)) via GLOBAL torch Size.
  PickleWriter& TorchSize(std::span<const int64_t> dims);

  const std::vector<std::byte>& bytes() const { return out_; }

 private:
  void Put(uint8_t b) { out_.push_back(static_cast<std::byte>(b)); }
  void PutLe(uint64_t v, int n);
  std::vector<std::byte> out_;
};

// A DCP .metadata as the test wants to write it (deliberately able to express invalid
// files: any dtype name, any ints, duplicated keys...).
struct MdChunk {
  Shape offsets, sizes;
};
struct MdItem {
  std::string fqn;
  bool is_tensor = true;
  std::string dtype = "float32";
  Shape size;
  std::vector<MdChunk> chunks;
  std::string layout = "torch.strided";
};
struct MdStorage {
  std::string fqn;
  std::optional<Shape> offset;
  std::optional<int64_t> index;
  std::string relative_path;
  int64_t offset_bytes = 0;
  int64_t length = 0;
  std::optional<std::vector<uint8_t>> length_long1;  // overrides length with raw LONG1 bytes
  std::vector<std::string> transform_descriptors;
};
struct MdSpec {
  std::string generation = "1.13";  // "1.13" or "2": module paths
  bool enum_by_value = false;       // REDUCE(EnumCls, (0,)) vs getattr(EnumCls, 'NAME')
  std::vector<MdItem> items;
  std::vector<MdStorage> storage;
  bool storage_data_none = false;
  std::optional<std::string> version;
  // storage_meta.checkpoint_id: nullopt = no storage_meta; path parts (3.12 form) or one
  // string (3.13 form, pathlib._local).
  std::optional<std::vector<std::string>> checkpoint_id_parts;
  bool checkpoint_id_py313 = false;
  bool mcore_data = false;  // mcore_data = {"decoder.w": {nd_reformulated_orig_global_shape: (8, 4)}}
  // When not empty, mcore_data holds these keys' nd_reformulated_orig_global_shape instead.
  std::vector<std::pair<std::string, Shape>> reformulated;
  std::string root_module;  // overrides the Metadata class module when set
};

MdSpec SpecFromMetadata(const DcpMetadata& md);
std::vector<std::byte> EncodeDcpMetadata(const MdSpec& spec);

}  // namespace fc::testing

#endif  // FC_TESTS_FORMAT_TORCH_TORCH_TEST_SUPPORT_H_
