// Private to fc_format: each writing format's entry of the output table
// (fc/format/output_format.h), defined in its own folder.
#ifndef FC_SRC_FORMAT_OUTPUT_ENTRIES_H_
#define FC_SRC_FORMAT_OUTPUT_ENTRIES_H_

#include <memory>

#include "fc/format/output_format.h"

namespace fc {

// A TargetFilesWriter over a writer class with FcDistcpWriter's calls for data (WriteChunk,
// WriteObject); each format adds its FinishDataFiles and Commit.
template <class Writer>
class WriterPart : public TargetFilesWriter {
 public:
  explicit WriterPart(std::unique_ptr<Writer> writer) : writer_(std::move(writer)) {}
  Status WriteChunk(size_t file, size_t chunk, uint64_t byte_offset,
                    std::span<const std::byte> bytes) override {
    return writer_->WriteChunk(file, chunk, byte_offset, bytes);
  }
  Status WriteObject(size_t object, std::span<const std::byte> bytes) override {
    return writer_->WriteObject(0, object, 0, bytes);
  }

 protected:
  std::unique_ptr<Writer> writer_;
};

OutputFormat FcDistcpOutputFormat();  // fc_distcp/output.cc
OutputFormat TorchDcpOutputFormat();  // torch/dcp_output.cc

}  // namespace fc

#endif  // FC_SRC_FORMAT_OUTPUT_ENTRIES_H_
