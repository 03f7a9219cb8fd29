// Reading PaddlePaddle FlexCheckpoint directories, as written by
// paddle.distributed.save_state_dict (shared/reference/formats.md section 5).
//
// Byte layout read:
//   <dir>/<id>.metadata        a pickle (protocol 4) of
//       Metadata{state_dict_metadata: {key: [LocalTensorMetadata, ...]},
//                storage_metadata:    {LocalTensorIndex: "<rank>_<id>.distcp"},
//                flat_mapping, ...}
//     from module paddle.distributed.flex_checkpoint.dcp.metadata, or the older
//     paddle.distributed.checkpoint.metadata (no dtype, global_shape or flattening there);
//       LocalTensorMetadata{global_offset, local_shape, dtype, global_shape, is_flattened,
//                           flattened_range}
//       LocalTensorIndex{tensor_key, global_offset, is_flattened, flattened_range,
//                        replica_id, local_shape}
//     dataclasses pickled as NEWOBJ + BUILD(dict); tuples of ints for offsets and shapes.
//   <dir>/<rank>_<id>.distcp   a pickle (paddle.save) of {key: numpy.ndarray, ...,
//       "StructuredToParameterName@@": {...}}; each ndarray is
//       numpy.core.multiarray._reconstruct(...) + BUILD((1, shape, dtype('<t', ...), is_fortran,
//       <raw bytes>)), the raw bytes inline in the pickle; a 2-tuple (name, ndarray) is
//       accepted too. bfloat16 is stored as '<u2' and told apart by the metadata dtype.
//     or, from save_state_dict(..., safetensors=True), a safetensors file (recognised by its
//     content: not a pickle, '{' at byte 8) whose tensors are the keys; its header is
//     validated as any safetensors file and each dtype must match the metadata's (BF16, or
//     U16 read as bfloat16 where the metadata says bfloat16). Paddle 3.3.1 names these
//     files <rank>_<id>.safetensors (the metadata's storage_metadata says so); such a
//     directory is detected as Paddle, not as HF safetensors (format/open.cc).
// A directory of HF *.safetensors files (with or without Paddle's auto-generated
// "flex-ckpt.auto_generated.metadata", which load_state_dict writes for them) is detected
// as a safetensors checkpoint and read by the safetensors reader, not here.
// <id> is the largest id among the data files (0 when there are none); with a single
// <id>.metadata that one is used.
//
// The data files are memory-mapped and parsed without copying the raw payloads: each chunk
// of the index points at its ndarray's bytes inside the pickle (column-major arrays get
// column-major strides), so fc reads Paddle shards in place like any other format.
// Flattened chunks (is_flattened) hold the [start, stop) slice of the row-major flattening
// of their box. Of several copies of one chunk, the one with the lowest replica_id (None
// counts as 0) is used.
//
// Errors: kNotFound for a missing metadata or data file; kDataLoss for anything malformed or
// inconsistent, sizes that overflow included (message names the file, the tensor and the
// values); kUnimplemented for a big-endian array or a dtype fc has no type for.
#ifndef FC_FORMAT_PADDLE_FLEX_H_
#define FC_FORMAT_PADDLE_FLEX_H_

#include <string>

#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

Result<CheckpointIndex> ReadPaddleFlexCheckpoint(const std::string& dir);

}  // namespace fc

#endif  // FC_FORMAT_PADDLE_FLEX_H_
