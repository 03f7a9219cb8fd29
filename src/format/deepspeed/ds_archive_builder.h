// One output archive of the DeepSpeed writer (fc/format/deepspeed_writer.h): the pickle of a
// tree whose storages are re-keyed, tensors the rewrite creates (placeholders) emitted with
// their new storages. Pure: it builds a DsArchiveSpec; ds_archive_writer writes it.
#ifndef FC_SRC_FORMAT_DEEPSPEED_DS_ARCHIVE_BUILDER_H_
#define FC_SRC_FORMAT_DEEPSPEED_DS_ARCHIVE_BUILDER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "fc/codec/pickle.h"
#include "fc/codec/pickle_writer.h"
#include "fc/core/status.h"
#include "fc/format/ds_archive_writer.h"
#include "src/format/deepspeed/ds_source_file.h"

namespace fc::deepspeed_writer_internal {

// Builds one output archive: the pickle of a tree whose storages are re-keyed, tensors the
// rewrite creates (placeholders) emitted with their new storages.
class ArchiveBuilder {
 public:
  explicit ArchiveBuilder(std::string path) { spec_.path = std::move(path); }

  // A new 1-D tensor of `view` elements over a new storage of record.elements elements.
  // `storage_class`: the GLOBAL torch.<X>Storage to name (taken from the source tensor).
  PickleValue::Ptr NewTensor(DsRecord record, int64_t view, PickleValue::Ptr storage_class);

  // Emits `root`; persistent ids of `source` become copied records.
  Result<DsArchiveSpec> Finish(const PickleValue& root, const SourceFile& source);

 private:
  struct Placeholder {
    size_t record = 0;
    int64_t view = 0;
    PickleValue::Ptr storage_class;
  };

  void EmitNewTensor(internal_torch::PickleWriter& w, const Placeholder& p);

  // ('storage', class, key, location, numel) with the key renumbered; BINPERSID.
  Status EmitSourceStorage(internal_torch::PickleWriter& w, const PickleValue& v,
                           const SourceFile& source);

  DsArchiveSpec spec_;
  std::map<const PickleValue*, Placeholder> placeholders_;
  std::map<std::string, size_t> keys_;  // source storage key -> record
};

}  // namespace fc::deepspeed_writer_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_DS_ARCHIVE_BUILDER_H_
