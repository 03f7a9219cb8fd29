// fc distcp: fc's native distributed checkpoint format (version 1). Reader, streaming
// writer with atomic commit, and checksum verification. man/fc-distcp.5 is the same
// specification in man-page form; keep the two in step with src/format/fc_distcp.
//
// 1. Directory
//
//      <ckpt>/fc.metadata.json        the metadata (section 2); written last
//      <ckpt>/<rank>_<id>.distcp      data files (section 3); rank and id are decimal
//                                     integers without sign or leading zeros ("0_0.distcp",
//                                     "3_1.distcp"); the writer enforces the pattern, the
//                                     reader accepts any name listed in the metadata that
//                                     ends in ".distcp" and contains no '/'.
//
//    Nothing else belongs in the directory; readers ignore other entries.
//    A directory is complete exactly when fc.metadata.json exists: writers build the
//    checkpoint in a sibling staging directory "<ckpt>.fc-tmp-<pid>-XXXXXX" (<pid>: the
//    creating process; XXXXXX: six random [A-Za-z0-9]; mkdir(2) mode 0777 & ~umask; the
//    protocol of fc/io/output_dir.h), write and fsync every data file, write and fsync fc.metadata.json, fsync
//    the staging directory, and only then rename(2) it to <ckpt> and fsync <ckpt>'s parent.
//    A crash leaves at most a "*.fc-tmp-*" directory, never a <ckpt> that looks complete.
//
// 2. fc.metadata.json: one UTF-8 JSON object (RFC 8259). fc writes it in Python
//    json.dumps(indent=2) style with each chunk and object record on one line, but readers
//    must accept any JSON whitespace and member order. Members (unknown members are
//    ignored by version-1 readers, so writers may add information without a version bump):
//
//      "format":     "fc-distcp"                                   required
//      "version":    1                                             required; a reader
//                    refuses larger versions (kUnimplemented)
//      "attributes": {"<str>": "<str>", ...}                       optional; free-form
//                    facts (e.g. "source_format": "torch-dcp"); go to
//                    CheckpointIndex::attributes
//      "files":      [{"name": "0_0.distcp", "size": <bytes>}, ...]   required
//                    every data file once; size is the exact file size
//      "tensors":    [<tensor>, ...]    required; keys unique, in the order tools list them
//      "objects":    [<object>, ...]    required (may be []); keys unique (a tensor and an
//                                       object may share one)
//
//    <tensor> = {"key": "<str>",
//                "dtype": "<name>",          canonical name of fc/core/dtype.h:
//                                            bool uint8 int8 int16 int32 int64 float16
//                                            bfloat16 float32 float64 float8_e4m3fn
//                                            float8_e5m2 (any ParseDType spelling is read)
//                "global_shape": [d0, ...],  non-negative integers ([] = 0-d tensor)
//                "chunks": [<chunk>, ...]}   possibly empty; may overlap (replicas)
//
//    <chunk>  = {"global_offset": [o0, ...], "local_shape": [l0, ...],
//                                            the Box; same rank as global_shape,
//                                            o_i + l_i <= d_i
//                "flattened_range": null | [min, max],
//                                            null: the whole box is stored;
//                                            [min, max): elements min..max-1 of the
//                                            box's row-major flattening, 0 <= min <= max
//                                            <= prod(local_shape)
//                "replica_id": r,            integer >= 0
//                "file": "0_0.distcp",       a name from "files"
//                "byte_offset": b,           absolute offset in that file (a multiple of
//                                            64 in files fc writes)
//                "byte_length": n,           == stored elements * dtype size, where stored
//                                            elements = max - min, or prod(local_shape)
//                "xxh3_64": "<16 hex>"}      XXH3-64 (seed 0) of bytes [b, b + n), as
//                                            16 lower-case hex digits (upper-case read)
//
//      Chunk bytes: little-endian, packed, row-major over local_shape, or (flattened)
//      the elements [min, max) of that order.
//
//    <object> = {"key": "<str>",
//                "encoding": "raw" | "torch_save",
//                "file": "...", "byte_offset": b, "byte_length": n, "xxh3_64": "<16 hex>"}
//
//      An object's bytes are carried verbatim (an iteration counter, RNG state, a
//      torch.save zip of a non-tensor value, ...).
//
// 3. Data files: each is a valid safetensors file (fc/format/safetensors.h), so any
//    safetensors reader can open one shard:
//
//      [0, 8)       u64 little-endian N
//      [8, 8+N)     compact JSON header, padded with spaces so that 8 + N is a multiple
//                   of 64; "__metadata__" is {"format": "fc-distcp", "version": "1"}
//      [8+N, EOF)   entries, each starting at a file offset that is a multiple of 64:
//        "<key>@<i>"   chunk i of tensor <key> (i = the chunk's position in the tensor's
//                      "chunks" array); dtype = the tensor's dtype (safetensors spelling);
//                      shape = local_shape, or [max - min] for a flattened chunk
//        "<key>@obj"   object <key>; dtype "U8", shape [byte_length]
//        "@pad<k>"     zero bytes that move the next entry to a multiple of 64; dtype
//                      "U8", shape [gap]; k counts 0, 1, ... within the file
//      Entries appear in the header in file-offset order: a file's chunks in plan order,
//      then its objects, with padding entries where needed. The metadata's byte_offset
//      of an entry is 8 + N + its data_offsets begin. Names are unambiguous: split at the
//      last '@'; the suffix is digits (chunk), "obj" or "pad<digits>".
//
// Checksums: every chunk and object carries xxh3_64. ReadFcDistcp does not read tensor
// bytes, so it does not check them; VerifyChunkChecksums does (fc-inspect --verify).
//
// Thread-safety: the free functions are re-entrant. FcDistcpWriter::WriteChunk and
// WriteObject may be called concurrently from several threads (also for the same file);
// Create, FinishDataFiles, Finish and Abort must not race with anything.
#ifndef FC_FORMAT_FC_DISTCP_H_
#define FC_FORMAT_FC_DISTCP_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/flat_range.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "fc/format/open_problems.h"
#include "fc/format/safetensors.h"

namespace fc {

inline constexpr std::string_view kFcDistcpMetadataFileName = "fc.metadata.json";
inline constexpr std::string_view kFcDistcpFormatName = "fc-distcp";
inline constexpr int kFcDistcpVersion = 1;
inline constexpr uint64_t kFcDistcpAlignment = 64;

// "<rank>_<id>.distcp".
std::string FcDistcpFileName(int64_t rank, int64_t id);

// "raw" / "torch_save", and back (kDataLoss for an unknown name).
std::string_view ObjectEncodingName(ObjectEncoding encoding);
Result<ObjectEncoding> ParseObjectEncoding(std::string_view name);

// ---------------------------------------------------------------------------------------
// Reading.

// Parses fc.metadata.json text into an index (format kFcDistcp, root = `root`), validating
// everything the text alone can show (all kDataLoss, naming tensor/chunk and values):
// JSON syntax and types, format name, version (kUnimplemented when > 1), unique file names
// and keys, dtypes, shapes, ValidateBox for each chunk, flattened range within the box,
// replica_id >= 0, byte_length == stored elements * dtype size (overflow-checked), every
// chunk/object inside its file's listed size, checksum syntax.
// With `lenient` (fc/format/open_problems.h): ranges past a file's listed size are left to
// VerifyCheckpoint, a byte_length longer than the elements need is recorded.
Result<CheckpointIndex> ParseFcDistcpMetadata(std::span<const std::byte> json,
                                              const std::string& root,
                                              OpenProblems* lenient = nullptr);

// Opens an fc distcp directory: ParseFcDistcpMetadata, then checks against the files:
// each exists (kNotFound) with its listed size (kDataLoss) and is a valid safetensors file
// whose entries are exactly the chunks and objects the metadata places in it (names,
// dtypes, shapes, byte ranges as in section 3) plus well-formed padding entries.
// Tensor bytes are not read; see VerifyChunkChecksums.
// CheckpointIndex::attributes gets the "attributes" member plus "fc_distcp_version".
// With `lenient` (fc-inspect --verify; fc/format/open_problems.h), recorded instead of
// failing: a data file whose size is not the listed one (the index keeps the size on disk;
// its entries are not compared), an unreadable safetensors header, an entry that differs
// from the metadata or is missing, an entry that is neither chunk, object nor padding, and
// what ParseFcDistcpMetadata records. Left to VerifyCheckpoint: missing files, ranges past
// a file's end.
Result<CheckpointIndex> ReadFcDistcp(const std::string& dir, OpenProblems* lenient = nullptr);

// ---------------------------------------------------------------------------------------
// Checksums (any CheckpointIndex whose chunks/objects carry xxh3_64, e.g. fc distcp).

// XXH3-64 (seed 0) of `length` bytes of `file` at `offset`, read in bounded slabs.
Result<uint64_t> Xxh3OfFileRange(const RandomAccessFile& file, uint64_t offset,
                                 uint64_t length);

struct ChecksumMismatch {
  bool is_object = false;
  std::string key;
  Box box;                                 // chunks only
  std::optional<FlatRange> flat_range;     // chunks only
  std::string file;                        // relative path
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  uint64_t expected = 0;
  uint64_t actual = 0;

  // "tensor 'w' chunk [0, 2) x [0, 6) in 0_0.distcp bytes [128, 176): xxh3_64 is
  // 1a2b..., metadata says 3c4d..."
  std::string ToString() const;
};

struct ChecksumReport {
  size_t checked = 0;    // chunks + objects hashed
  size_t unchecked = 0;  // chunks + objects without a checksum (skipped)
  uint64_t bytes_hashed = 0;
  std::vector<ChecksumMismatch> mismatches;  // in index order
};

// Hashes every chunk and object that has xxh3_64 and compares.
// Errors: kNotFound / kIoError / kDataLoss when a file cannot be read (a range past the end
// of a file is kDataLoss); a mismatch is not an error here.
Result<ChecksumReport> CheckChunkChecksums(const CheckpointIndex& index);

// CheckChunkChecksums, turned into a Status: OK when nothing mismatches; kVerifyFailed
// otherwise, the message listing each mismatch (the first 20, then "... and K more") by
// key, box (and flat range), file and byte range.
Status VerifyChunkChecksums(const CheckpointIndex& index);

// ---------------------------------------------------------------------------------------
// Writing.
//
// The writer takes the whole plan up front (that fixes every header and every byte
// offset), then accepts chunk bytes in slabs, in any order, from any thread:
//
//   FcDistcpPlan plan = ...;                               // tensors + per-file entries
//   auto w = FcDistcpWriter::Create(out_dir, plan);        // staging dir + all files
//   w->WriteChunk(file, chunk, offset_in_chunk, bytes);   // each byte exactly once
//   w->WriteObject(file, object, offset_in_object, bytes);
//   w->Finish();                                           // checksums, metadata, rename
//
// Checksums: slabs of an entry that arrive in order (offset 0, then each slab starting
// where the previous ended) feed a streaming XXH3 state, so the common sequential case
// never re-reads. The first out-of-order slab of an entry drops its state and marks it
// for re-hashing: FinishDataFiles then reads that entry back from the (fsynced) file.
// Only entries in progress hold a state (~600 bytes each).
//
// Several processes (MPI ranks) writing one checkpoint:
//   rank 0:     staging = CreateFcDistcpStagingDir(out_dir); broadcast it
//   every rank: w = Create(out_dir, plan, {.files = my files, .staging_dir = staging});
//               write; digests = w->FinishDataFiles(); gather digests to rank 0
//   rank 0:     CommitFcDistcpMetadata(out_dir, staging, plan, all digests)
//               (on any failure: AbortFcDistcpStaging(staging))
// A writer given a staging directory never removes it; it removes only its own files
// on Abort.

struct FcDistcpTensorSpec {
  std::string key;
  DType dtype = DType::kFloat32;
  Shape global_shape;
};

struct FcDistcpChunkSpec {
  std::string key;  // a FcDistcpTensorSpec key
  Box box;
  std::optional<FlatRange> flat_range;
  int64_t replica_id = 0;
};

struct FcDistcpObjectSpec {
  std::string key;
  ObjectEncoding encoding = ObjectEncoding::kRaw;
  uint64_t byte_length = 0;
};

struct FcDistcpFileSpec {
  std::string name;  // "<rank>_<id>.distcp"
  std::vector<FcDistcpChunkSpec> chunks;
  std::vector<FcDistcpObjectSpec> objects;
};

// The whole checkpoint. The writer lists a tensor's chunks in the metadata in file order,
// then in their order within the file; that position is the chunk's "<key>@<i>" index.
// Objects are listed the same way.
struct FcDistcpPlan {
  std::vector<FcDistcpTensorSpec> tensors;  // metadata order; every chunk's key is here
  std::vector<FcDistcpFileSpec> files;
  std::map<std::string, std::string> attributes;
};

// Checks a plan (kInvalidArgument naming the offending item): file names match
// "<rank>_<id>.distcp" and are unique; tensor keys unique and valid UTF-8 (so are object
// keys); every chunk's key is a tensor; ValidateBox against the tensor's shape; flattened
// range within the box; replica_id >= 0; sizes do not overflow; object keys unique.
Status ValidateFcDistcpPlan(const FcDistcpPlan& plan);

// Where entry bytes go, computed from the plan alone (every rank computes the same).
struct FcDistcpFileLayout {
  SafetensorsLayout safetensors;           // header and offsets
  std::vector<size_t> chunk_index;         // file chunk -> its position in its tensor's
                                           // "chunks" array (the "<key>@<i>" suffix)
  std::vector<uint64_t> chunk_offset;      // file chunk -> absolute byte offset
  std::vector<uint64_t> chunk_bytes;       // file chunk -> byte length
  std::vector<uint64_t> object_offset;
  std::vector<uint64_t> object_bytes;
};
Result<std::vector<FcDistcpFileLayout>> ComputeFcDistcpLayouts(const FcDistcpPlan& plan);

// The checksums of one written file, in its plan order.
struct FcDistcpFileDigests {
  size_t file = 0;  // index into plan.files
  std::vector<uint64_t> chunk_xxh3;
  std::vector<uint64_t> object_xxh3;
};

// The complete fc.metadata.json text for a plan and the digests of all its files
// (deterministic). Errors: kInvalidArgument when digests miss a file, repeat one, or have
// the wrong counts.
Result<std::string> FcDistcpMetadataJson(const FcDistcpPlan& plan,
                                         std::span<const FcDistcpFileDigests> digests);

// Creates "<out_dir>.fc-tmp-<pid>-XXXXXX" next to out_dir and returns its path
// (CreateStagingDir of fc/io/output_dir.h).
// Errors: kFailedPrecondition when out_dir exists and is not an empty directory;
// kIoError when the parent is missing or not writable.
Result<std::string> CreateFcDistcpStagingDir(const std::string& out_dir);

// Commits a staging directory whose data files are all written and synced: checks that
// every plan file is present with the planned size, writes and fsyncs fc.metadata.json,
// fsyncs the staging directory, renames it to out_dir (replacing an empty directory) and
// fsyncs the parent. Errors: kInvalidArgument for inconsistent digests, kDataLoss for a
// missing or wrong-sized data file, kFailedPrecondition when out_dir has appeared and is
// not empty, kIoError. On error the staging directory is left for the caller to abort.
Status CommitFcDistcpMetadata(const std::string& out_dir, const std::string& staging_dir,
                              const FcDistcpPlan& plan,
                              std::span<const FcDistcpFileDigests> digests);

// Removes a staging directory and everything in it (missing is fine).
void AbortFcDistcpStaging(const std::string& staging_dir);

struct FcDistcpWriterOptions {
  // Indices into plan.files that this writer writes; empty = all of them.
  std::vector<size_t> files;
  // A directory from CreateFcDistcpStagingDir shared by several writers; empty = the
  // writer creates (and owns) its own.
  std::string staging_dir;
  // Bytes of slabs that arrive ahead of the bytes before them in their entry (several
  // threads writing one chunk) kept in memory until those are in, so that each entry is
  // hashed as it is written. 0, or a slab that would pass the limit: the entry is hashed
  // from the file by FinishDataFiles instead (a second read of it).
  uint64_t reorder_limit = 0;
};

class FcDistcpWriter {
 public:
  // Validates the plan, creates (or adopts) the staging directory, and creates this
  // writer's data files with their headers. Errors: ValidateFcDistcpPlan's; kInvalidArgument
  // for a bad file index in options; CreateFcDistcpStagingDir's; kIoError.
  static Result<std::unique_ptr<FcDistcpWriter>> Create(const std::string& out_dir,
                                                        FcDistcpPlan plan,
                                                        FcDistcpWriterOptions options = {});
  // Before FinishDataFiles succeeded: Abort(). After it, a writer that owns its staging
  // directory removes that directory unless it was committed (renamed away); a writer on a
  // shared staging directory leaves its finished files for the committing process.
  ~FcDistcpWriter();
  FcDistcpWriter(const FcDistcpWriter&) = delete;
  FcDistcpWriter& operator=(const FcDistcpWriter&) = delete;

  const std::string& out_dir() const { return out_dir_; }
  const std::string& staging_dir() const { return staging_dir_; }
  const FcDistcpPlan& plan() const { return plan_; }
  const std::vector<FcDistcpFileLayout>& layouts() const { return layouts_; }
  // Bytes FinishDataFiles hashed from the written files: entries whose slabs came out of
  // order past the reorder limit (FcDistcpWriterOptions::reorder_limit).
  uint64_t rehashed_bytes() const { return rehashed_bytes_; }

  // Writes `bytes` at `offset` of chunk `chunk` of plan file `file` (offset in bytes
  // from the chunk's first stored element). kInvalidArgument for a file this writer does
  // not write, an index or range out of bounds, or bytes written twice.
  Status WriteChunk(size_t file, size_t chunk, uint64_t offset, std::span<const std::byte> bytes);
  Status WriteObject(size_t file, size_t object, uint64_t offset,
                     std::span<const std::byte> bytes);

  // Finishes this writer's data files: all bytes present (kFailedPrecondition naming the
  // missing entry otherwise), fsync, close, re-hash the entries written out of order, and
  // fsync the staging directory. Returns the digests of this writer's files.
  Result<std::vector<FcDistcpFileDigests>> FinishDataFiles();

  // Single writer for the whole plan (options.files empty or all, own staging directory):
  // FinishDataFiles + CommitFcDistcpMetadata. On error the staging directory is removed.
  Status Finish();

  // Closes and deletes this writer's files; also the staging directory if it owns it.
  void Abort();

 private:
  struct EntryHash;
  struct FileState;
  FcDistcpWriter();
  Status WriteEntry(size_t file, size_t entry, uint64_t offset, std::span<const std::byte> bytes);
  // Forgets the slabs of `entry` kept ahead of its hash (it is hashed from the file instead).
  void DropPending(FileState& fs, size_t entry);

  std::string out_dir_;
  std::string staging_dir_;
  bool owns_staging_ = false;
  FcDistcpPlan plan_;
  std::vector<FcDistcpFileLayout> layouts_;
  std::vector<std::unique_ptr<FileState>> files_;  // per plan file; null when not ours
  enum class State { kOpen, kDataDone, kCommitted, kAborted } state_ = State::kOpen;
  uint64_t reorder_limit_ = 0;
  uint64_t rehashed_bytes_ = 0;
  std::atomic<uint64_t> pending_bytes_{0};  // slabs kept ahead of their entry's hash, all files
};

}  // namespace fc

#endif  // FC_FORMAT_FC_DISTCP_H_
