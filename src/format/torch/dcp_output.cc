// PyTorch DCP's entry in the output table: TorchDcpWriter as a TargetFilesWriter. The
// settings pick the metadata generation and the serialization; .metadata needs nothing from
// the other parts (the plan places every item).
#include "fc/format/torch_dcp_writer.h"
#include "src/format/output_entries.h"

namespace fc {
namespace {

Result<TorchDcpWriteOptions> WriteOptions(const OutputSettings& settings) {
  TorchDcpWriteOptions options;
  std::string version = settings.torch_version;
  if (version.empty()) version = settings.source_torch_generation;
  if (version.empty()) version = "2";
  if (version == "1.13") {
    options.generation = TorchGeneration::k1_13;
  } else if (version == "2.0") {
    options.generation = TorchGeneration::k2_0;
  } else if (version == "2") {
    options.generation = TorchGeneration::k2;
  } else {
    return InvalidArgumentError("--torch-version '" + version + "': expected 1.13, 2.0 or 2");
  }
  if (settings.torch_serialization == "safetensors") {
    options.serialization = TorchDcpSerialization::kSafetensors;
  } else if (!settings.torch_serialization.empty() &&
             settings.torch_serialization != "torch-save") {
    return InvalidArgumentError("--torch-serialization '" + settings.torch_serialization +
                                "': expected torch-save or safetensors");
  }
  return options;
}

class TorchDcpPart : public WriterPart<TorchDcpWriter> {
 public:
  using WriterPart::WriterPart;
  Result<std::string> FinishDataFiles() override {
    FC_RETURN_IF_ERROR(writer_->FinishDataFiles());
    return std::string();
  }
  Status Commit(std::span<const std::string>) override { return writer_->CommitMetadata(); }
};

}  // namespace

OutputFormat TorchDcpOutputFormat() {
  return OutputFormat{
      .name = "torch-dcp",
      .summary = "PyTorch DCP (__R_0.distcp + .metadata) that torch's load_state_dict "
                 "reads (--torch-version, --torch-serialization); flattened target chunks are "
                 "not possible there",
      .shape = OutputShape::kTargetFiles,
      .file_name = [](int64_t rank) { return "__" + std::to_string(rank) + "_0.distcp"; },
      // DCP stores non-tensor values as torch.save items; raw bytes have no such form.
      .stores_object = [](ObjectEncoding e) { return e == ObjectEncoding::kTorchSave; },
      .check = [](const FcDistcpPlan& plan, const OutputSettings& settings) -> Status {
        FC_ASSIGN_OR_RETURN(TorchDcpWriteOptions options, WriteOptions(settings));
        return ValidateTorchDcpPlan(plan, options);
      },
      .create = [](const std::string& out_dir, const FcDistcpPlan& plan, std::vector<size_t> files,
                   const std::string& staging_dir,
                   const OutputSettings& settings) -> Result<std::unique_ptr<TargetFilesWriter>> {
        FC_ASSIGN_OR_RETURN(TorchDcpWriteOptions options, WriteOptions(settings));
        options.files = std::move(files);
        options.staging_dir = staging_dir;
        FC_ASSIGN_OR_RETURN(std::unique_ptr<TorchDcpWriter> writer,
                            TorchDcpWriter::Create(out_dir, plan, options));
        return std::unique_ptr<TargetFilesWriter>(new TorchDcpPart(std::move(writer)));
      },
  };
}

}  // namespace fc
