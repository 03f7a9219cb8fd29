// Torch.save archives of several storages. Contract: include/fc/format/ds_archive_writer.h.
//
// Why the layout is fixed at Create: every record's size is known (the pickle, the streamed
// partitions' element counts, the copied ranges), so each slab is pwritten to its final place
// and Finish writes only the data descriptors and the directory.
#include "fc/format/ds_archive_writer.h"

#include <algorithm>
#include <mutex>
#include <set>

#include "fc/codec/zip_writer.h"
#include "fc/core/checked_math.h"
#include "fc/io/file.h"

namespace fc {
namespace {

using internal_torch::Crc32;

constexpr std::string_view kByteOrder = "little";
constexpr std::string_view kVersion = "3\n";

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

}  // namespace

struct DsArchiveWriter::ArchiveState {
  DsArchiveSpec spec;
  internal_torch::ZipLayout zip;  // records: data.pkl, byteorder, data/0.., version
  std::unique_ptr<WritableFile> file;
  std::mutex mu;
  std::vector<internal_torch::CrcParts> parts;  // per storage record
  std::vector<uint32_t> crcs;                   // per zip record, known ones
};

DsArchiveWriter::~DsArchiveWriter() = default;

Result<std::unique_ptr<DsArchiveWriter>> DsArchiveWriter::Create(
    const std::string& dir, std::vector<DsArchiveSpec> archives) {
  std::unique_ptr<DsArchiveWriter> w(new DsArchiveWriter());
  w->dir_ = dir;
  std::set<std::string> made;
  for (DsArchiveSpec& spec : archives) {
    auto st = std::make_unique<ArchiveState>();
    // torch.save names the records after the file, up to its first '.'.
    std::string prefix = Basename(spec.path);
    prefix = prefix.substr(0, prefix.find('.'));
    if (prefix.empty()) prefix = "archive";
    std::vector<internal_torch::ZipRecordSpec> recs;
    recs.push_back({prefix + "/data.pkl", spec.pickle.size()});
    recs.push_back({prefix + "/byteorder", kByteOrder.size()});
    for (size_t k = 0; k < spec.records.size(); ++k) {
      recs.push_back({prefix + "/data/" + std::to_string(k), spec.records[k].bytes});
    }
    recs.push_back({prefix + "/version", kVersion.size()});
    st->zip = internal_torch::ComputeZipLayout(std::move(recs));
    st->parts.resize(spec.records.size());
    st->crcs.assign(st->zip.records.size(), 0);
    const std::string path = JoinPath(dir, spec.path);
    const std::string parent = Dirname(path);
    if (made.insert(parent).second) FC_RETURN_IF_ERROR(CreateDirectories(parent));
    FC_ASSIGN_OR_RETURN(st->file, WritableFile::Create(path));
    FC_RETURN_IF_ERROR(st->file->Reserve(st->zip.archive_size));
    const size_t n = st->zip.records.size();
    for (size_t i = 0; i < n; ++i) {
      FC_RETURN_IF_ERROR(st->file->WriteAt(st->zip.placements[i].header_offset,
                                           AsBytes(internal_torch::ZipLocalHeader(st->zip, i))));
    }
    const std::string_view fixed[] = {spec.pickle, kByteOrder};
    for (size_t i = 0; i < 2; ++i) {
      st->crcs[i] = Crc32(0, AsBytes(fixed[i]));
      FC_RETURN_IF_ERROR(st->file->WriteAt(st->zip.placements[i].data_offset, AsBytes(fixed[i])));
    }
    st->crcs[n - 1] = Crc32(0, AsBytes(kVersion));
    FC_RETURN_IF_ERROR(st->file->WriteAt(st->zip.placements[n - 1].data_offset, AsBytes(kVersion)));
    st->spec = std::move(spec);
    w->archives_.push_back(std::move(st));
  }
  return w;
}

Status DsArchiveWriter::Write(size_t archive, size_t record, uint64_t offset,
                              std::span<const std::byte> bytes) {
  if (archive >= archives_.size() || record >= archives_[archive]->spec.records.size() ||
      archives_[archive]->spec.records[record].kind != DsRecord::Kind::kStream) {
    return InvalidArgumentError(dir_ + ": no streamed record " + std::to_string(record) +
                                " in archive " + std::to_string(archive));
  }
  ArchiveState& st = *archives_[archive];
  const DsRecord& rec = st.spec.records[record];
  const std::optional<uint64_t> end = CheckedAddU(offset, bytes.size());
  if (!end || *end > rec.bytes) {
    return InvalidArgumentError(st.spec.path + ": " + rec.name + ": bytes [" +
                                std::to_string(offset) + ", +" + std::to_string(bytes.size()) +
                                ") pass its end " + std::to_string(rec.bytes));
  }
  if (bytes.empty()) return Status::Ok();
  const uint32_t crc = Crc32(0, bytes);
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (internal_torch::AddCrcPart(st.parts[record], offset, *end, crc)) {
      return InvalidArgumentError(st.spec.path + ": " + rec.name + ": bytes at " +
                                  std::to_string(offset) + " written twice");
    }
  }
  return st.file->WriteAt(st.zip.placements[record + 2].data_offset + offset, bytes);
}

Status DsArchiveWriter::Finish(uint64_t copy_block) {
  copy_block = std::max<uint64_t>(copy_block, 4096);
  std::vector<std::byte> block;
  for (const std::unique_ptr<ArchiveState>& a : archives_) {
    ArchiveState& st = *a;
    for (size_t k = 0; k < st.spec.records.size(); ++k) {
      const DsRecord& rec = st.spec.records[k];
      const uint64_t at = st.zip.placements[k + 2].data_offset;
      uint32_t crc = 0;
      if (rec.kind == DsRecord::Kind::kCopy) {
        FC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> in,
                            RandomAccessFile::Open(rec.copy_from));
        block.resize(static_cast<size_t>(std::min(copy_block, std::max<uint64_t>(rec.bytes, 1))));
        for (uint64_t done = 0; done < rec.bytes;) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), rec.bytes - done));
          std::span<std::byte> part(block.data(), n);
          FC_RETURN_IF_ERROR(in->ReadAt(rec.copy_offset + done, part).With(rec.copy_from));
          crc = Crc32(crc, part);
          FC_RETURN_IF_ERROR(st.file->WriteAt(at + done, std::span<const std::byte>(part)));
          done += n;
        }
      } else if (rec.bytes > 0) {
        const internal_torch::CrcParts& parts = st.parts[k];
        if (parts.size() != 1 || parts.begin()->first != 0 ||
            parts.begin()->second.end != rec.bytes) {
          return InternalError(st.spec.path + ": " + rec.name + ": not every byte was written");
        }
        crc = parts.begin()->second.crc;
      }
      st.crcs[k + 2] = crc;
    }
    for (size_t i = 0; i < st.zip.records.size(); ++i) {
      FC_RETURN_IF_ERROR(st.file->WriteAt(
          st.zip.placements[i].descriptor_offset,
          AsBytes(internal_torch::ZipDataDescriptor(st.zip, i, st.crcs[i]))));
    }
    FC_RETURN_IF_ERROR(st.file->WriteAt(st.zip.central_directory_offset,
                                        AsBytes(internal_torch::ZipDirectoryTail(st.zip, st.crcs))));
    FC_RETURN_IF_ERROR(st.file->Sync());
    FC_RETURN_IF_ERROR(st.file->Close());
  }
  return Status::Ok();
}

}  // namespace fc
