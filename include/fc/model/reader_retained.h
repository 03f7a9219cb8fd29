// What a reader kept of the files it parsed while opening a checkpoint, so that a writer of
// the same format can plan from it instead of opening and parsing those files again (issue
// 33: no second open of the input). Opaque here: model/ knows no format. A format's reader
// derives its own (DeepSpeed: src/format/deepspeed/parsed_files.h) and holds it in
// CheckpointIndex::retained; that format's writers downcast it (dynamic_cast) and read the
// files themselves when an index carries none (an index built by hand, another reader).
//
// Thread-safety: immutable once the reader returns; shared by every copy of the index.
#ifndef FC_MODEL_READER_RETAINED_H_
#define FC_MODEL_READER_RETAINED_H_

namespace fc {

class ReaderRetained {
 public:
  virtual ~ReaderRetained() = default;
};

}  // namespace fc

#endif  // FC_MODEL_READER_RETAINED_H_
