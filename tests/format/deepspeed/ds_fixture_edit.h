// The DeepSpeed fixtures of testdata/deepspeed (torch 1.13, stand-in DeepSpeed classes) for
// tests that read or write copies of them with one thing changed: where a fixture lies, a
// fresh copy of its tag dir, and edits of a copied torch.save file's pickle
// (tests/format/megatron/pickle_edit.h).
#ifndef FC_TESTS_FORMAT_DEEPSPEED_DS_FIXTURE_EDIT_H_
#define FC_TESTS_FORMAT_DEEPSPEED_DS_FIXTURE_EDIT_H_

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "tests/format/megatron/pickle_edit.h"
#include "tests/format/torch/torch_test_support.h"
#include "tests/support/testdata.h"

namespace fc::testing::deepspeed {

// testdata/deepspeed/<name> ($FC_TESTDATA).
inline std::string Fixture(const std::string& name) {
  return TestdataPath("deepspeed/" + name);
}

// A fresh copy of fixture `name`'s tag dir (ckpt/global_step3) under `tmp`; with
// `keep_tag_name` the copy is itself named global_step3 (the DeepSpeed writer names its
// output after the tag dir).
inline std::string CopyTag(const TempDir& tmp, const std::string& name, bool keep_tag_name = false) {
  return CopyTreeInto(tmp, Fixture(name) + "/ckpt/global_step3", name,
                      keep_tag_name ? "global_step3" : "");
}

// Rewrites the torch.save zip at `path` with `edit` applied to its pickled root.
inline void Edit(const std::string& path, const std::function<void(PV&)>& edit) {
  RewriteTorchSave(path, [&](PV& root, ZipRecords&) { edit(root); });
}
// Edits the optimizer_state_dict of an optimizer file.
inline void EditOsd(const std::string& path, const std::function<void(PV&)>& edit) {
  Edit(path, [&](PV& root) { edit(At(root, "optimizer_state_dict")); });
}

}  // namespace fc::testing::deepspeed

#endif  // FC_TESTS_FORMAT_DEEPSPEED_DS_FIXTURE_EDIT_H_
