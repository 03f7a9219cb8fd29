// Megatron's invariant between a param's optimizer master weight and its model weight:
// Megatron copies the fp32 main params into the model params after every step (a cast,
// round to nearest even), so a param's saved model weight is its master weight in the
// model's dtype. Both optimizer readers (float16_optimizer.cc, distrib_optim.cc) check every
// master they place with it.
#ifndef FC_SRC_FORMAT_MEGATRON_MASTER_CHECK_H_
#define FC_SRC_FORMAT_MEGATRON_MASTER_CHECK_H_

#include <string>

#include "fc/core/status.h"
#include "fc/io/file.h"
#include "src/format/megatron/rank_file.h"

namespace fc::megatron_internal {

// Checks the invariant above on the first and last few elements of every param: a layout
// that puts any param at a wrong offset fails here. Two reads per file and param (the
// model's elements one by one when it is a strided view); `master` is read as contiguous
// fp32. kDataLoss names the param and values.
Status CheckMasterRoundsToModel(const RandomAccessFile& optim_file, const Located& master,
                                const RandomAccessFile& model_file, const Located& model,
                                const std::string& name);

}  // namespace fc::megatron_internal

#endif  // FC_SRC_FORMAT_MEGATRON_MASTER_CHECK_H_
