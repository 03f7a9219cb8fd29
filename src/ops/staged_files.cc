// Contract: src/ops/staged_files.h.
#include "src/ops/staged_files.h"

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "fc/io/file.h"

namespace fc {

Status CopyFileInBlocks(const std::string& from, const std::string& to, uint64_t block_bytes) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> in, RandomAccessFile::Open(from));
  FC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, WritableFile::Create(to));
  std::vector<std::byte> block(
      static_cast<size_t>(std::max<uint64_t>(1, std::min<uint64_t>(block_bytes, in->size()))));
  for (uint64_t at = 0; at < in->size(); at += block.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), in->size() - at));
    std::span<std::byte> part(block.data(), n);
    FC_RETURN_IF_ERROR(in->ReadAt(at, part));
    FC_RETURN_IF_ERROR(out->Append(std::span<const std::byte>(part)));
  }
  FC_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

Status WriteSmallFile(const std::string& path, std::string_view bytes) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, WritableFile::Create(path));
  FC_RETURN_IF_ERROR(out->Append(bytes));
  FC_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

}  // namespace fc
