// Writing torch.save archives of several storages whose pickle is known before any data
// exists (the DeepSpeed files fc-convert --output-format deepspeed writes:
// fc/format/deepspeed_writer.h). Every storage record is either streamed in (slabs from the
// executor, any order, any thread: the layout is fixed at Create) or copied from a range of
// another file (a source storage kept byte for byte).
//
// Byte layout: a zip of STORED records, as torch.save writes (fc/codec/zip_writer.h):
//   <name>/data.pkl   the given pickle
//   <name>/byteorder  "little"
//   <name>/data/<k>   storage k, k = 0, 1, ... in DsArchiveSpec::records order
//   <name>/version    "3\n"
// <name> is the file name up to its first '.', as torch.save names the records. CRCs of
// streamed records are combined from the slabs' CRCs (AddCrcPart); copied records' while
// copying; nothing is read back.
//
// Thread-safety: DsArchiveWriter::Write may run concurrently for distinct byte ranges;
// Create and Finish from one thread.
#ifndef FC_FORMAT_DS_ARCHIVE_WRITER_H_
#define FC_FORMAT_DS_ARCHIVE_WRITER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fc/core/dtype.h"
#include "fc/core/status.h"

namespace fc {

// Elements [dst_begin, + length) of a streamed record come from elements
// [src_begin, + length) of source tensor `source` (an index into the job's source tensors,
// DsRepartition::source), or are zeros when source < 0. The writer does not read them: the
// caller streams the bytes in (Write).
struct DsStreamPart {
  int64_t source = -1;
  int64_t src_begin = 0;
  int64_t dst_begin = 0;
  int64_t length = 0;
};

// One storage record (<name>/data/<k>) of a written archive.
struct DsRecord {
  enum class Kind { kStream, kCopy };
  Kind kind = Kind::kStream;
  uint64_t bytes = 0;
  // kStream: `elements` of `dtype`, filled from `parts` (they tile [0, elements)).
  DType dtype = DType::kFloat32;
  int64_t elements = 0;
  std::vector<DsStreamPart> parts;
  std::string name;  // kStream: what it holds, e.g. "mp_rank_00 rank 1 group 0 exp_avg"
  // kCopy: bytes [copy_offset, + bytes) of the file copy_from (absolute path).
  std::string copy_from;
  uint64_t copy_offset = 0;
};

struct DsArchiveSpec {
  std::string path;    // relative to the output directory
  std::string pickle;  // <name>/data.pkl
  std::vector<DsRecord> records;  // storage keys "0", "1", ... in this order
};

class DsArchiveWriter {
 public:
  // Creates every archive under `dir` (and its directories) and writes what is fixed: the
  // pickle, byteorder and every local header. Errors: kIoError.
  static Result<std::unique_ptr<DsArchiveWriter>> Create(const std::string& dir,
                                                         std::vector<DsArchiveSpec> archives);
  ~DsArchiveWriter();
  DsArchiveWriter(const DsArchiveWriter&) = delete;
  DsArchiveWriter& operator=(const DsArchiveWriter&) = delete;

  // Bytes [offset, + bytes.size()) of kStream record `record` of archive `archive`.
  // Errors: kInvalidArgument for bytes outside the record, written twice, or a kCopy record.
  Status Write(size_t archive, size_t record, uint64_t offset, std::span<const std::byte> bytes);
  // Copies every kCopy record in blocks of at most `copy_block` bytes (CRC computed while
  // copying), writes descriptors and directories, checks every streamed byte was written
  // (kInternal otherwise), syncs and closes.
  Status Finish(uint64_t copy_block);

 private:
  struct ArchiveState;
  DsArchiveWriter() = default;
  std::string dir_;
  std::vector<std::unique_ptr<ArchiveState>> archives_;
};

}  // namespace fc

#endif  // FC_FORMAT_DS_ARCHIVE_WRITER_H_
