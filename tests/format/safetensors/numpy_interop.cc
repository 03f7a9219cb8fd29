// Interop check: a file written by fc's SafetensorsWriter is read by an independent
// json + numpy reader (numpy_check.py) and must give the same names, dtypes, shapes, values
// and bytes. Meson test protocol: exit 0 pass, 1 fail, 77 skip (no /usr/bin/python3 or no
// numpy).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fc/core/dtype_convert.h"
#include "fc/format/safetensors.h"
#include "tests/format/safetensors/st_test_util.h"

namespace fc {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

std::string Hex(std::span<const std::byte> b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::byte x : b) {
    s.push_back(d[static_cast<uint8_t>(x) >> 4]);
    s.push_back(d[static_cast<uint8_t>(x) & 15]);
  }
  return s;
}

struct Tensor {
  SafetensorsTensorSpec spec;
  std::vector<std::byte> data;
  long long sum = 0;
};

Tensor Make(std::string name, DType dtype, Shape shape) {
  Tensor t{{std::move(name), dtype, std::move(shape)}, {}, 0};
  int64_t n = 1;
  for (int64_t d : t.spec.shape) n *= d;
  const bool is_unsigned = dtype == DType::kUInt8;
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    long long v = dtype == DType::kBool ? i % 2 : is_unsigned ? i % 7 : i % 7 - 3;
    values[static_cast<size_t>(i)] = static_cast<double>(v);
    t.sum += v;
  }
  t.data.resize(static_cast<size_t>(n) * DTypeSize(dtype));
  Status s = ConvertElements(values.data(), DType::kFloat64, t.data.data(), dtype,
                             static_cast<size_t>(n));
  if (!s.ok()) {
    std::cerr << "ConvertElements: " << s.ToString() << "\n";
    std::exit(1);
  }
  return t;
}

int Run() {
  if (::access(kPython, X_OK) != 0) {
    std::cerr << "SKIP: " << kPython << " not found\n";
    return 77;
  }
  if (std::system((std::string(kPython) + " -c 'import numpy' 2>/dev/null").c_str()) != 0) {
    std::cerr << "SKIP: numpy is not importable by " << kPython << "\n";
    return 77;
  }
  const std::string script = testing::TestdataPath("../tests/format/safetensors/numpy_check.py");

  std::vector<Tensor> tensors = {
      Make("model.embed.weight", DType::kFloat32, {5, 3}),
      Make("bf16", DType::kBFloat16, {2, 3, 2}),
      Make("half", DType::kFloat16, {7}),
      Make("double", DType::kFloat64, {2, 2}),
      Make("i64.scalar", DType::kInt64, {}),
      Make("i32", DType::kInt32, {3, 1}),
      Make("i16", DType::kInt16, {4}),
      Make("i8", DType::kInt8, {9}),
      Make("u8", DType::kUInt8, {3, 3}),
      Make("mask", DType::kBool, {5}),
      Make("empty", DType::kFloat32, {0, 4}),
  };
  int failures = 0;
  for (bool aligned : {false, true}) {
    testing::TempDir tmp;
    const std::string path = tmp.Join("interop.safetensors");
    std::vector<SafetensorsTensorSpec> specs;
    for (const Tensor& t : tensors) specs.push_back(t.spec);
    SafetensorsWriteOptions options;
    if (aligned) {
      options.alignment = 64;
      options.align_each_tensor = true;
    }
    auto w = SafetensorsWriter::Create(path, specs, {{"format", "pt"}}, options);
    if (!w.ok()) {
      std::cerr << w.status().ToString() << "\n";
      return 1;
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      Status s = (*w)->WriteTensor(i, tensors[i].data);
      if (!s.ok()) {
        std::cerr << s.ToString() << "\n";
        return 1;
      }
    }
    if (Status s = (*w)->Finish(); !s.ok()) {
      std::cerr << s.ToString() << "\n";
      return 1;
    }

    const std::string out = tmp.Join("out.txt");
    const std::string cmd = std::string(kPython) + " " + script + " " + path + " > " + out;
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
      std::cerr << "FAIL: " << cmd << " exited with " << rc << "\n";
      return 1;
    }
    std::map<std::string, std::string> lines;
    std::istringstream in(testing::ReadText(out));
    for (std::string line; std::getline(in, line);) lines[line.substr(0, line.find(' '))] = line;
    for (const Tensor& t : tensors) {
      std::string shape;
      for (size_t i = 0; i < t.spec.shape.size(); ++i) {
        shape += (i ? "x" : "") + std::to_string(t.spec.shape[i]);
      }
      if (shape.empty()) shape = "scalar";
      const std::string expected = t.spec.name + " " +
                                   std::string(DTypeSafetensorsName(t.spec.dtype)) + " " +
                                   shape + " " + std::to_string(t.sum) + " " + Hex(t.data);
      if (lines[t.spec.name] != expected) {
        std::cerr << "FAIL (aligned=" << aligned << "):\n  numpy: " << lines[t.spec.name]
                  << "\n  want:  " << expected << "\n";
        ++failures;
      }
    }
  }
  if (failures == 0) std::cout << "numpy reads fc's safetensors files: OK\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace fc

int main() { return fc::Run(); }
