// Test helper: rewrites a torch DCP checkpoint with TorchDcpWriter under a new, random
// chunk layout, so that real torch can be asked to load what fc wrote
// (tests/format/torch/torch_writer_interop_test.py drives it).
//
//   torch_dcp_rewrite SRC_CKPT OUT_DIR [--generation 1.13|2] [--ranks R]
//                     [--files-per-rank F] [--max-pieces P] [--seed S] [--threads T]
//                     [--synthetic-rows N --synthetic-npy PATH]
//
// Every tensor of SRC_CKPT (read with fc's reader, strides honoured) is cut into a random
// grid of at most P pieces per axis; each piece goes to a random file __<r>_<n>.distcp
// (r < R, n < F); objects are copied verbatim to random files. Slabs are written in random
// order from T threads. --synthetic-rows adds a float32 tensor "synthetic" of shape [N, 4]
// (element (i, j) = i * 4 + j) stored one row per chunk (a large .metadata), and writes its
// value to PATH as .npy. Exit status 0 on success, 1 with a message otherwise.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fc/core/box.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/torch_dcp.h"
#include "fc/format/torch_dcp_writer.h"
#include "fc/io/file.h"

namespace fc {
namespace {

struct Args {
  std::string src, out;
  TorchGeneration generation = TorchGeneration::k1_13;
  int ranks = 2, files_per_rank = 1, max_pieces = 3, threads = 2;
  uint64_t seed = 1;
  int64_t synthetic_rows = 0;
  std::string synthetic_npy;
};

std::vector<int64_t> RandomCuts(std::mt19937_64& rng, int64_t n, int max_pieces) {
  if (n == 0) return {0, 0};  // an empty axis: one empty piece
  std::set<int64_t> cuts = {0, n};
  const int64_t pieces = n <= 1 ? 1 : 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_pieces));
  while (static_cast<int64_t>(cuts.size()) < std::min<int64_t>(pieces, n) + 1) {
    cuts.insert(1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n - 1)));
  }
  return {cuts.begin(), cuts.end()};
}

Status WriteNpyF32(const std::string& path, const Shape& shape, const std::vector<float>& v) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (int64_t d : shape) header += std::to_string(d) + ", ";
  header += "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  FC_ASSIGN_OR_RETURN(auto f, WritableFile::Create(path));
  FC_RETURN_IF_ERROR(f->Append(out));
  return f->Close();
}

struct Slab {
  size_t file;
  bool is_object;
  size_t index;
  uint64_t offset;
  std::span<const std::byte> bytes;
};

Status Run(const Args& args) {
  std::mt19937_64 rng(args.seed);
  FC_ASSIGN_OR_RETURN(CheckpointIndex src, ReadTorchDcp(args.src));
  ChunkReader reader(src);

  FcDistcpPlan plan;
  for (int r = 0; r < args.ranks; ++r) {
    for (int n = 0; n < args.files_per_rank; ++n) {
      plan.files.push_back({"__" + std::to_string(r) + "_" + std::to_string(n) + ".distcp", {}, {}});
    }
  }
  auto pick = [&]() { return rng() % plan.files.size(); };

  // Full tensor values, and per file the bytes of each chunk / object (kept alive here).
  std::map<std::string, std::vector<std::byte>> values;
  std::vector<std::vector<std::vector<std::byte>>> chunk_bytes(plan.files.size());
  std::vector<std::vector<std::vector<std::byte>>> object_bytes(plan.files.size());
  auto add_chunk = [&](size_t f, const std::string& key, DType dtype, const Shape& shape,
                       const Box& box) {
    plan.files[f].chunks.push_back({key, box, std::nullopt, 0});
    std::vector<std::byte> b(static_cast<size_t>(box.num_elements()) * DTypeSize(dtype));
    if (!b.empty()) {
      CopyRegion(values.at(key).data(), Box::Whole(shape), {}, b.data(), box, box, DTypeSize(dtype));
    }
    chunk_bytes[f].push_back(std::move(b));
  };

  for (const TensorEntry& t : src.tensors) {
    plan.tensors.push_back({t.key, t.dtype, t.global_shape});
    const Box whole = Box::Whole(t.global_shape);
    std::vector<std::byte> v(static_cast<size_t>(whole.num_elements()) * DTypeSize(t.dtype));
    for (const Chunk& c : t.chunks) {
      FC_RETURN_IF_ERROR(reader.CopyChunkRegion(t, c, c.box, v.data(), whole));
    }
    values[t.key] = std::move(v);
    std::vector<std::vector<int64_t>> cuts;
    for (int64_t d : t.global_shape) cuts.push_back(RandomCuts(rng, d, args.max_pieces));
    std::vector<size_t> pos(t.global_shape.size(), 0);
    while (true) {
      Box box;
      for (size_t a = 0; a < pos.size(); ++a) {
        box.global_offset.push_back(cuts[a][pos[a]]);
        box.local_shape.push_back(cuts[a][pos[a] + 1] - cuts[a][pos[a]]);
      }
      add_chunk(pick(), t.key, t.dtype, t.global_shape, box);
      size_t a = pos.size();
      while (a > 0 && ++pos[a - 1] + 1 >= cuts[a - 1].size()) pos[--a] = 0;
      if (a == 0) break;
    }
  }
  if (args.synthetic_rows > 0) {
    const Shape shape = {args.synthetic_rows, 4};
    std::vector<float> v(static_cast<size_t>(args.synthetic_rows) * 4);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
    values["synthetic"] = std::vector<std::byte>(v.size() * sizeof(float));
    std::memcpy(values["synthetic"].data(), v.data(), v.size() * sizeof(float));
    plan.tensors.push_back({"synthetic", DType::kFloat32, shape});
    for (int64_t r = 0; r < args.synthetic_rows; ++r) {
      add_chunk(static_cast<size_t>(r) % plan.files.size(), "synthetic", DType::kFloat32, shape,
                Box{{r, 0}, {1, 4}});
    }
    FC_RETURN_IF_ERROR(WriteNpyF32(args.synthetic_npy, shape, v));
  }
  for (const ObjectEntry& o : src.objects) {
    FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, reader.File(o.file));
    FC_ASSIGN_OR_RETURN(std::vector<std::byte> b, f->ReadAt(o.byte_offset, o.byte_length));
    const size_t file = pick();
    plan.files[file].objects.push_back({o.key, o.encoding, o.byte_length});
    object_bytes[file].push_back(std::move(b));
  }

  TorchDcpWriteOptions options;
  options.generation = args.generation;
  FC_ASSIGN_OR_RETURN(auto writer, TorchDcpWriter::Create(args.out, plan, options));
  std::vector<Slab> slabs;
  auto cut = [&](size_t f, bool is_object, size_t i, const std::vector<std::byte>& b) {
    const auto c = RandomCuts(rng, static_cast<int64_t>(b.size()), 3);
    for (size_t k = 0; k + 1 < c.size(); ++k) {
      slabs.push_back({f, is_object, i, static_cast<uint64_t>(c[k]),
                       std::span(b).subspan(static_cast<size_t>(c[k]),
                                            static_cast<size_t>(c[k + 1] - c[k]))});
    }
  };
  for (size_t f = 0; f < plan.files.size(); ++f) {
    for (size_t c = 0; c < chunk_bytes[f].size(); ++c) cut(f, false, c, chunk_bytes[f][c]);
    for (size_t o = 0; o < object_bytes[f].size(); ++o) cut(f, true, o, object_bytes[f][o]);
  }
  std::shuffle(slabs.begin(), slabs.end(), rng);
  std::atomic<size_t> next{0};
  std::vector<Status> errors(static_cast<size_t>(args.threads));
  auto work = [&](size_t t) {
    for (size_t i; (i = next++) < slabs.size();) {
      const Slab& s = slabs[i];
      Status st = s.is_object ? writer->WriteObject(s.file, s.index, s.offset, s.bytes)
                              : writer->WriteChunk(s.file, s.index, s.offset, s.bytes);
      if (!st.ok() && errors[t].ok()) errors[t] = st;
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < errors.size(); ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  for (const Status& s : errors) FC_RETURN_IF_ERROR(s);
  return writer->Finish();
}

int Main(int argc, char** argv) {
  Args a;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--generation") {
      const std::string g = value();
      if (g != "1.13" && g != "2.0" && g != "2") {
        std::fprintf(stderr, "--generation must be 1.13, 2.0 or 2\n");
        return 2;
      }
      a.generation = g == "2"     ? TorchGeneration::k2
                     : g == "2.0" ? TorchGeneration::k2_0
                                  : TorchGeneration::k1_13;
    } else if (arg == "--ranks") {
      a.ranks = std::stoi(value());
    } else if (arg == "--files-per-rank") {
      a.files_per_rank = std::stoi(value());
    } else if (arg == "--max-pieces") {
      a.max_pieces = std::stoi(value());
    } else if (arg == "--seed") {
      a.seed = std::stoull(value());
    } else if (arg == "--threads") {
      a.threads = std::max(1, std::stoi(value()));
    } else if (arg == "--synthetic-rows") {
      a.synthetic_rows = std::stoll(value());
    } else if (arg == "--synthetic-npy") {
      a.synthetic_npy = value();
    } else {
      pos.push_back(arg);
    }
  }
  if (pos.size() != 2 || a.ranks < 1 || a.files_per_rank < 1 || a.max_pieces < 1 ||
      (a.synthetic_rows > 0 && a.synthetic_npy.empty())) {
    std::fprintf(stderr,
                 "usage: torch_dcp_rewrite SRC_CKPT OUT_DIR [--generation 1.13|2] [--ranks R] "
                 "[--files-per-rank F] [--max-pieces P] [--seed S] [--threads T] "
                 "[--synthetic-rows N --synthetic-npy PATH]\n");
    return 2;
  }
  a.src = pos[0];
  a.out = pos[1];
  const Status s = Run(a);
  if (!s.ok()) {
    std::fprintf(stderr, "torch_dcp_rewrite: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace fc

int main(int argc, char** argv) { return fc::Main(argc, argv); }
