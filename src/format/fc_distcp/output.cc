// fc distcp's entry in the output table: FcDistcpWriter as a TargetFilesWriter. Each part
// hashes the chunks it writes; the committing process needs every file's checksums for
// fc.metadata.json, so FinishDataFiles returns them as bytes that travel to it.
#include "fc/format/fc_distcp.h"
#include "src/format/output_entries.h"

namespace fc {
namespace {

// Digests as little-endian u64 words: count, then per file: file index, chunk count, chunk
// digests, object count, object digests.
std::string SerializeDigests(const std::vector<FcDistcpFileDigests>& digests) {
  std::vector<uint64_t> words{digests.size()};
  for (const FcDistcpFileDigests& d : digests) {
    words.push_back(d.file);
    words.push_back(d.chunk_xxh3.size());
    words.insert(words.end(), d.chunk_xxh3.begin(), d.chunk_xxh3.end());
    words.push_back(d.object_xxh3.size());
    words.insert(words.end(), d.object_xxh3.begin(), d.object_xxh3.end());
  }
  std::string bytes(words.size() * 8, '\0');
  for (size_t i = 0; i < words.size(); ++i) {
    for (int b = 0; b < 8; ++b) bytes[i * 8 + b] = static_cast<char>(words[i] >> (8 * b));
  }
  return bytes;
}

Status ParseDigests(const std::string& bytes, std::vector<FcDistcpFileDigests>& out) {
  if (bytes.empty()) return Status::Ok();  // a process that wrote no file
  if (bytes.size() % 8 != 0) {
    return InternalError("digest message of " + std::to_string(bytes.size()) + " bytes");
  }
  std::vector<uint64_t> words(bytes.size() / 8);
  for (size_t i = 0; i < words.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      words[i] |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i * 8 + b])) << (8 * b);
    }
  }
  size_t at = 0;
  auto next = [&](uint64_t& v) {
    if (at >= words.size()) return false;
    v = words[at++];
    return true;
  };
  auto list = [&](std::vector<uint64_t>& v) {
    uint64_t n = 0;
    if (!next(n) || n > words.size() - at) return false;
    const auto first = words.begin() + static_cast<std::ptrdiff_t>(at);
    v.assign(first, first + static_cast<std::ptrdiff_t>(n));
    at += n;
    return true;
  };
  uint64_t count = 0;
  next(count);
  for (uint64_t i = 0; i < count; ++i) {
    FcDistcpFileDigests d;
    uint64_t file = 0;
    if (!next(file) || !list(d.chunk_xxh3) || !list(d.object_xxh3)) {
      return InternalError("truncated digest message");
    }
    d.file = static_cast<size_t>(file);
    out.push_back(std::move(d));
  }
  if (at != words.size()) return InternalError("digest message has trailing words");
  return Status::Ok();
}

class FcDistcpPart : public WriterPart<FcDistcpWriter> {
 public:
  using WriterPart::WriterPart;
  Result<std::string> FinishDataFiles() override {
    FC_ASSIGN_OR_RETURN(std::vector<FcDistcpFileDigests> digests, writer_->FinishDataFiles());
    return SerializeDigests(digests);
  }
  Status Commit(std::span<const std::string> parts) override {
    std::vector<FcDistcpFileDigests> digests;
    for (const std::string& m : parts) FC_RETURN_IF_ERROR(ParseDigests(m, digests));
    return CommitFcDistcpMetadata(writer_->out_dir(), writer_->staging_dir(),
                                  writer_->plan(), digests);
  }
};

}  // namespace

OutputFormat FcDistcpOutputFormat() {
  return OutputFormat{
      .name = "fc",
      .summary = "fc distcp (default): safetensors data files with xxh3-64 checksums per "
                 "chunk and fc.metadata.json (fc-distcp(5)); n-d boxes and flattened ranges",
      .shape = OutputShape::kTargetFiles,
      .file_name = [](int64_t rank) { return FcDistcpFileName(rank, 0); },
      .stores_object = [](ObjectEncoding) { return true; },
      .check = [](const FcDistcpPlan& plan, const OutputSettings&) {
        return ValidateFcDistcpPlan(plan);
      },
      .create = [](const std::string& out_dir, const FcDistcpPlan& plan, std::vector<size_t> files,
                   const std::string& staging_dir,
                   const OutputSettings& settings) -> Result<std::unique_ptr<TargetFilesWriter>> {
        FcDistcpWriterOptions options;
        options.files = std::move(files);
        options.staging_dir = staging_dir;
        options.reorder_limit = settings.reorder_bytes;
        FC_ASSIGN_OR_RETURN(std::unique_ptr<FcDistcpWriter> writer,
                            FcDistcpWriter::Create(out_dir, plan, options));
        return std::unique_ptr<TargetFilesWriter>(new FcDistcpPart(std::move(writer)));
      },
  };
}

}  // namespace fc
