// InMemoryEnv and FaultInjectingEnv on their own; the POSIX read policy (FIFOs, devices,
// symlinks out of the directory); OutputDir's lock, nesting checks, sweep and commit.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <fstream>
#include <thread>

#include "fc/io/env.h"
#include "fc/io/file.h"
#include "fc/io/output_dir.h"
#include "tests/support/temp_dir.h"

namespace fc {
namespace {

std::string Text(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

TEST_CASE("in-memory env: files, directories, rename of a tree", "[io][env]") {
  InMemoryEnv mem;
  ScopedEnvOverride scoped(&mem);
  REQUIRE(CreateDirectories("/a/b").ok());
  CHECK(IsDirectory("/a"));
  {
    auto w = WritableFile::Create("/a/b/f");
    REQUIRE(w.ok());
    REQUIRE((*w)->Append(std::string_view("hello world")).ok());
    REQUIRE((*w)->Close().ok());
  }
  CHECK_FALSE(WritableFile::Create("/missing/f").ok());
  auto r = RandomAccessFile::Open("/a/b/f");
  REQUIRE(r.ok());
  CHECK((*r)->size() == 11);
  auto part = (*r)->ReadAt(6, 5);
  REQUIRE(part.ok());
  CHECK(Text(*part) == "world");
  CHECK((*r)->ReadAt(8, 5).status().code() == StatusCode::kDataLoss);
  auto m = MappedFile::Open("/a/b/f");
  REQUIRE(m.ok());
  CHECK((*m)->bytes().size() == 11);
  CHECK(RandomAccessFile::Open("/a/b").status().code() == StatusCode::kInvalidArgument);
  CHECK(RandomAccessFile::Open("/a/x").status().code() == StatusCode::kNotFound);
  REQUIRE(CreateDirectories("/c").ok());
  REQUIRE(RenameDurably("/a", "/c").ok());  // onto an empty directory
  CHECK_FALSE(PathExists("/a/b/f"));
  auto moved = ReadWholeFile("/c/b/f", 100);
  REQUIRE(moved.ok());
  CHECK(Text(*moved) == "hello world");
  REQUIRE(CreateDirectories("/d").ok());
  CHECK_FALSE(RenameDurably("/d", "/c").ok());  // onto a non-empty directory
  auto names = ListDirectory("/");
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"c", "d"});
  REQUIRE(RemoveAll("/c").ok());
  CHECK_FALSE(PathExists("/c/b/f"));
}

TEST_CASE("fault env: fails the Nth operation once; short reads are looped over", "[io][env]") {
  InMemoryEnv mem;
  REQUIRE(mem.CreateDirectory("/d").ok());
  REQUIRE(mem.WriteFileForTest("/d/f", "0123456789").ok());
  FaultInjectingEnv env(&mem);
  ScopedEnvOverride scoped(&env);
  env.FailNth(FaultOp::kRead, 2);
  auto f = RandomAccessFile::Open("/d/f");
  REQUIRE(f.ok());
  CHECK((*f)->ReadAt(0, 3).ok());
  auto failed = (*f)->ReadAt(0, 3);
  CHECK(failed.status().code() == StatusCode::kIoError);
  CHECK(failed.status().message().find("injected fault: read #2 on /d/f") != std::string::npos);
  CHECK((*f)->ReadAt(0, 3).ok());
  CHECK(env.Fired());
  env.FailNth(FaultOp::kRead, 0);
  env.ShortReads(1);
  env.ResetCounts();
  auto all = (*f)->ReadAt(0, 10);
  REQUIRE(all.ok());
  CHECK(Text(*all) == "0123456789");
  CHECK(env.Count(FaultOp::kRead) == 10);
  // Scattered reads across buffer boundaries, one byte at a time.
  std::string a(3, '.'), b(0, '.'), c(4, '.');
  std::vector<std::span<std::byte>> bufs = {
      std::as_writable_bytes(std::span<char>(a.data(), a.size())),
      std::as_writable_bytes(std::span<char>(b.data(), b.size())),
      std::as_writable_bytes(std::span<char>(c.data(), c.size()))};
  REQUIRE((*f)->ReadScatteredAt(2, bufs).ok());
  CHECK(a + c == "2345678");
  env.ShortReads(0);
  CHECK((*f)->ReadScatteredAt(5, bufs).code() == StatusCode::kDataLoss);
  env.FailNth(FaultOp::kRename, 1);
  CHECK_FALSE(RenameDurably("/d/f", "/d/g").ok());
  CHECK(RenameDurably("/d/f", "/d/g").ok());
}

TEST_CASE("reads: only regular files; a FIFO does not block", "[io][policy]") {
  testing::TempDir s;
  const std::string fifo = JoinPath(s.path(), "fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  auto r = RandomAccessFile::Open(fifo);  // would block without O_NONBLOCK
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().message() == fifo + ": is a FIFO, expected a regular file");
  CHECK_FALSE(MappedFile::Open(fifo).ok());
  auto dev = RandomAccessFile::Open("/dev/null");
  REQUIRE_FALSE(dev.ok());
  CHECK(dev.status().message().find("character device") != std::string::npos);
}

TEST_CASE("reads: symlinks out of their directory need follow_symlinks", "[io][policy]") {
  testing::TempDir s;
  REQUIRE(CreateDirectories(JoinPath(s.path(), "ckpt")).ok());
  auto w = WritableFile::Create(JoinPath(s.path(), "outside"));
  REQUIRE(w.ok());
  REQUIRE((*w)->Append(std::string_view("x")).ok());
  REQUIRE((*w)->Close().ok());
  w = WritableFile::Create(JoinPath(s.path(), "ckpt/inside"));
  REQUIRE(w.ok());
  REQUIRE((*w)->Close().ok());
  REQUIRE(::symlink("../outside", JoinPath(s.path(), "ckpt/out").c_str()) == 0);
  REQUIRE(::symlink("inside", JoinPath(s.path(), "ckpt/in").c_str()) == 0);
  CHECK(RandomAccessFile::Open(JoinPath(s.path(), "ckpt/in")).ok());
  auto refused = RandomAccessFile::Open(JoinPath(s.path(), "ckpt/out"));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK(refused.status().message().find("outside the checkpoint directory") != std::string::npos);
  CHECK(refused.status().message().find("--follow-symlinks") != std::string::npos);
  SetIoPolicy(IoPolicy{true});
  CHECK(RandomAccessFile::Open(JoinPath(s.path(), "ckpt/out")).ok());
  SetIoPolicy(IoPolicy{false});
}

TEST_CASE("posix writes: disjoint ranges from two threads, across write-back starts", "[io][env]") {
  // 40 pieces of 1 MiB + 1000 bytes, odd and even pieces from two threads, the second thread
  // from the end: more than two write-back strides, started (and written pages dropped) while
  // the other thread writes. Pieces end mid-page, so a page one thread filled in part may be
  // written back and dropped before the other thread writes the rest of it.
  testing::TempDir s;
  const std::string path = JoinPath(s.path(), "big");
  auto file = PosixEnv()->CreateForWrite(path);
  REQUIRE(file.ok());
  constexpr size_t kPiece = (size_t{1} << 20) + 1000, kPieces = 40;
  auto fill = [](size_t piece) {
    std::vector<std::byte> b(kPiece);
    for (size_t i = 0; i < b.size(); ++i) b[i] = std::byte((piece * 131 + i * 7) & 0xff);
    return b;
  };
  std::vector<Status> status(2);
  auto writer = [&](int parity) {
    for (size_t k = 0; k < kPieces / 2; ++k) {
      const size_t piece = parity == 0 ? 2 * k : kPieces - 1 - 2 * k;
      Status st = (*file)->WriteAt(piece * kPiece, fill(piece));
      if (!st.ok()) status[parity] = st;
    }
  };
  std::thread other(writer, 1);
  writer(0);
  other.join();
  REQUIRE(status[0].ok());
  REQUIRE(status[1].ok());
  REQUIRE((*file)->Sync().ok());
  REQUIRE((*file)->Close().ok());
  auto read = PosixEnv()->OpenForRead(path);
  REQUIRE(read.ok());
  REQUIRE((*read)->size() == kPieces * kPiece);
  std::vector<std::byte> got(kPiece);
  for (size_t piece = 0; piece < kPieces; ++piece) {
    auto n = (*read)->Read(piece * kPiece, got);
    REQUIRE(n.ok());
    REQUIRE(*n == kPiece);
    REQUIRE(got == fill(piece));
  }
}

namespace {
// How many of the file's pages are in the page cache (mincore on an untouched mapping).
size_t ResidentPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st;
  ::fstat(fd, &st);
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  ::mincore(p, bytes, resident.data());
  ::munmap(p, bytes);
  return static_cast<size_t>(
      std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return r & 1; }));
}

// Writes `bytes` to `path`, on disk and out of the page cache where the filesystem allows.
void WriteUncached(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  std::vector<char> data(bytes, 'x');
  REQUIRE(::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()));
  REQUIRE(::fdatasync(fd) == 0);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
}  // namespace

TEST_CASE("reserve: the space is allocated, the size unchanged, the bytes written in any order",
          "[io][env]") {
  // 3 MiB + 5 bytes, written back to front in pieces that start mid-block, some large enough
  // to go direct.
  const uint64_t size = (uint64_t{3} << 20) + 5;
  std::vector<std::byte> want(size);
  for (uint64_t i = 0; i < size; ++i) want[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  auto write_reversed = [&](WritableFile& w) {
    const uint64_t cuts[] = {0, 4097, (uint64_t{1} << 20) + 3, (uint64_t{2} << 20) + 11, size};
    for (int k = 3; k >= 0; --k) {
      const std::span<const std::byte> piece(want.data() + cuts[k], cuts[k + 1] - cuts[k]);
      REQUIRE(w.WriteAt(cuts[k], piece).ok());
    }
  };
  SECTION("posix") {
    testing::TempDir s;
    const std::string path = s.path() + "/f";
    auto w = WritableFile::Create(path);
    REQUIRE(w.ok());
    REQUIRE((*w)->Reserve(size).ok());
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK(st.st_size == 0);
    // Allocated: at least the file's bytes in 512-byte units, where the file system can
    // allocate ahead (asked directly of a probe file).
    const int probe = ::open((s.path() + "/probe").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(probe >= 0);
    const bool can_allocate = ::fallocate(probe, FALLOC_FL_KEEP_SIZE, 0, 4096) == 0;
    ::close(probe);
    if (can_allocate) {
      CHECK(static_cast<uint64_t>(st.st_blocks) * 512 >= size);
    } else {
      WARN("this file system cannot allocate ahead: nothing to check");
    }
    write_reversed(**w);
    REQUIRE((*w)->Sync().ok());
    REQUIRE((*w)->Close().ok());
    auto back = ReadWholeFile(path, size);
    REQUIRE(back.ok());
    CHECK(*back == want);
    // Nothing to reserve, and space the disk does not have: refused, naming the file.
    auto z = WritableFile::Create(s.path() + "/empty");
    REQUIRE(z.ok());
    CHECK((*z)->Reserve(0).ok());
    auto big = WritableFile::Create(s.path() + "/big");
    REQUIRE(big.ok());
    Status too_big = (*big)->Reserve(uint64_t{1} << 62);
    if (!too_big.ok()) {
      CHECK_THAT(too_big.message(), Catch::Contains(s.path() + "/big") &&
                                        Catch::Contains(std::to_string(uint64_t{1} << 62)));
    }
  }
  SECTION("in memory") {
    InMemoryEnv mem;
    ScopedEnvOverride scoped(&mem);
    auto w = WritableFile::Create("/f");
    REQUIRE(w.ok());
    REQUIRE((*w)->Reserve(size).ok());
    auto mid = ReadWholeFile("/f", size);
    REQUIRE(mid.ok());
    CHECK(mid->empty());
    write_reversed(**w);
    REQUIRE((*w)->Close().ok());
    auto back = ReadWholeFile("/f", size);
    REQUIRE(back.ok());
    CHECK(*back == want);
  }
  SECTION("fault env: a reserve is an operation that can fail") {
    InMemoryEnv mem;
    FaultInjectingEnv env(&mem);
    ScopedEnvOverride scoped(&env);
    env.FailNext(FaultOp::kReserve);
    auto w = WritableFile::Create("/f");
    REQUIRE(w.ok());
    Status st = (*w)->Reserve(size);
    CHECK(st.code() == StatusCode::kIoError);
    CHECK_THAT(st.message(), Catch::Contains("injected fault: reserve #1 on /f"));
    CHECK(env.Count(FaultOp::kReserve) == 1);
    CHECK(env.Count(FaultOp::kWrite) == 0);
  }
}

TEST_CASE("posix reads: pages read off the disk are dropped behind the reader, cached ones stay",
          "[io][env][page_cache]") {
  // The page-cache path: with direct IO the cold file's reads would not enter the cache.
  const IoPolicy saved = GetIoPolicy();
  SetIoPolicy(IoPolicy{saved.follow_symlinks, /*direct_io=*/false});
  struct Restore {
    IoPolicy policy;
    ~Restore() { SetIoPolicy(policy); }
  } restore{saved};
  testing::TempDir s;
  const std::string cold = JoinPath(s.path(), "cold"), warm = JoinPath(s.path(), "warm");
  // Two slab streams' worth of the 32 MiB read-ahead: drops come in steps behind the end.
  constexpr size_t kBytes = size_t{64} << 20, kSlab = size_t{2} << 20;
  WriteUncached(cold, kBytes);
  WriteUncached(warm, kBytes);
  if (ResidentPages(cold) != 0) {
    WARN("this filesystem keeps written pages cached (tmpfs?): nothing to check");
    return;
  }
  {  // The user's cat: the warm file is cached before fc reads it.
    std::ifstream in(warm, std::ios::binary);
    std::vector<char> sink(kBytes);
    in.read(sink.data(), static_cast<std::streamsize>(sink.size()));
  }
  const size_t warm_pages = ResidentPages(warm);
  REQUIRE(warm_pages > 0);
  for (const std::string& path : {cold, warm}) {
    auto file = PosixEnv()->OpenForRead(path);
    REQUIRE(file.ok());
    std::vector<std::byte> got(kSlab);
    for (size_t at = 0; at < kBytes; at += kSlab) {
      auto n = (*file)->Read(at, got);
      REQUIRE(n.ok());
      REQUIRE(*n == kSlab);
      REQUIRE(got[0] == std::byte{'x'});
    }
  }
  // Drops trail the stream and catch up at the end of the file: of what was read only the
  // last slab stays (the advice comes before each read). Kept, the read-ahead would have
  // left all 64 MiB cached.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  CHECK(ResidentPages(cold) * page <= kSlab);
  CHECK(ResidentPages(warm) == warm_pages);
}

namespace {
// The byte at `offset` of the direct IO test's file: no period a misplaced block would hide in.
std::byte PatternByte(uint64_t offset) {
  return std::byte(static_cast<uint8_t>(offset * 7 + offset / 4099 + (offset >> 16)));
}
std::vector<std::byte> Pattern(uint64_t offset, size_t length) {
  std::vector<std::byte> b(length);
  for (size_t i = 0; i < length; ++i) b[i] = PatternByte(offset + i);
  return b;
}
bool DirectIoAllowedIn(const std::string& dir) {
  const std::string probe = JoinPath(dir, "direct-probe");
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}
}  // namespace

TEST_CASE("posix direct IO: large writes and cold reads bypass the page cache, same bytes",
          "[io][env][direct]") {
  testing::TempDir s;
  if (!DirectIoAllowedIn(s.path())) {
    WARN("this filesystem refuses O_DIRECT: nothing to check");
    return;
  }
  const IoPolicy saved = GetIoPolicy();
  struct Restore {
    IoPolicy policy;
    ~Restore() { SetIoPolicy(policy); }
  } restore{saved};
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // Pieces that start and end mid-block, from two threads, the second from the end; one of
  // 5 MiB + 3 (more than a bounce buffer); one aligned in file and memory (no bounce copy);
  // small ones (page cache). 12 MiB + 2500 bytes in all: under the 16 MiB write-back stride,
  // so pages written through the page cache are still cached before the Sync.
  struct Piece {
    uint64_t offset;
    size_t length;
  };
  std::vector<Piece> pieces;
  uint64_t at = 0;
  for (size_t length : {size_t{1000}, (size_t{1} << 20) + 1000, (size_t{1} << 20) + 77,
                        (size_t{5} << 20) + 3, size_t{500}}) {
    pieces.push_back({at, length});
    at += length;
  }
  const uint64_t aligned_at = (at + 4095) / 4096 * 4096;
  pieces.push_back({at, static_cast<size_t>(aligned_at - at)});  // small, up to the boundary
  pieces.push_back({aligned_at, size_t{2} << 20});                 // aligned in file
  at = aligned_at + (size_t{2} << 20);
  pieces.push_back({at, (size_t{2} << 20) + 920});
  const uint64_t file_size = at + (size_t{2} << 20) + 920;

  // Direct IO on (the file reserved a byte under the size written through the page cache);
  // on in the policy but off on the threads that read and write (ScopedThreadDirectIo, as
  // the executor's workers under a small budget); off; on, with the file reserved at
  // IoPolicy::page_cache_write_min_file_bytes (written through the page cache, read direct).
  const char* const kModes[] = {"direct", "direct policy, off on the threads", "page cache",
                                "direct, the file reserved as large"};
  for (int mode = 0; mode < 4; ++mode) {
    DYNAMIC_SECTION(kModes[mode]) {
      const bool direct = mode == 0 || mode == 3;  // reads
      const bool direct_writes = mode == 0;
      const bool thread_allows = mode != 1;
      SetIoPolicy(IoPolicy{saved.follow_symlinks, mode != 2,
                           mode == 3 ? file_size : file_size + 1});
      ForgetColdInput();  // the cold reads of the modes before
      const std::string path = JoinPath(s.path(), "f" + std::to_string(mode));
      auto file = PosixEnv()->CreateForWrite(path);
      REQUIRE(file.ok());
      if (mode == 0 || mode == 3) REQUIRE((*file)->Reserve(file_size).ok());
      std::vector<Status> status(2, Status::Ok());
      auto writer = [&](int parity) {
        const ScopedThreadDirectIo scope(thread_allows);
        for (size_t k = 0; k < pieces.size(); ++k) {
          const size_t index = parity == 0 ? k : pieces.size() - 1 - k;
          if (index % 2 != static_cast<size_t>(parity)) continue;
          const Piece& p = pieces[index];
          Status st;
          if (p.offset % 4096 == 0) {  // from memory aligned to the block
            std::unique_ptr<std::byte, decltype(&std::free)> mem(
                // aligned_alloc wants a multiple of the alignment
                static_cast<std::byte*>(std::aligned_alloc(4096, (p.length + 4095) / 4096 * 4096)),
                &std::free);
            const std::vector<std::byte> b = Pattern(p.offset, p.length);
            std::copy(b.begin(), b.end(), mem.get());
            st = (*file)->WriteAt(p.offset, std::span<const std::byte>(mem.get(), p.length));
          } else {
            st = (*file)->WriteAt(p.offset, Pattern(p.offset, p.length));
          }
          if (!st.ok()) status[static_cast<size_t>(parity)] = st;
        }
      };
      std::thread other(writer, 1);
      writer(0);
      other.join();
      REQUIRE(status[0].ok());
      REQUIRE(status[1].ok());
      // Direct: only the part-blocks at the pieces' ends (and the small pieces) were cached.
      const size_t cached_pages = ResidentPages(path);
      if (direct_writes) {
        CHECK(cached_pages <= 2 * pieces.size() + 2);
      } else {
        CHECK(cached_pages * page >= file_size - 2 * page);
      }
      REQUIRE((*file)->Sync().ok());
      REQUIRE((*file)->Close().ok());
      {  // Out of the cache, so reading it is a cold read.
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        REQUIRE(fd >= 0);
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
      }
      REQUIRE(ResidentPages(path) == 0);
      const ScopedThreadDirectIo scope(thread_allows);
      auto read = PosixEnv()->OpenForRead(path);
      REQUIRE(read.ok());
      REQUIRE((*read)->size() == file_size);
      // The first 6 MiB, at odd offsets, in reads of 1 MiB + 9 (direct when allowed).
      const size_t kRead = (size_t{1} << 20) + 9;
      std::vector<std::byte> got(kRead);
      for (uint64_t from = 5; from + kRead <= (uint64_t{6} << 20); from += kRead) {
        auto n = (*read)->Read(from, got);
        REQUIRE(n.ok());
        REQUIRE(*n == kRead);
        REQUIRE(got == Pattern(from, kRead));
      }
      if (direct) {
        // A direct read brings nothing into the cache (page-cache reads would have read
        // 32 MiB ahead, here the rest of the file).
        CHECK(ResidentPages(path) == 0);
        // Small reads go through the page cache without read-ahead: their own pages only
        // (read-ahead would fetch from the disk bytes that direct reads then fetch again).
        std::vector<std::byte> small(size_t{16} << 10);
        for (int i = 0; i < 8; ++i) {
          const uint64_t small_at = (uint64_t{6} << 20) + 100 + i * small.size();
          auto k = (*read)->Read(small_at, small);
          REQUIRE(k.ok());
          REQUIRE(*k == small.size());
          CHECK(small == Pattern(small_at, small.size()));
        }
        CHECK(ResidentPages(path) * page <= 8 * small.size() + page);
      }
      // Scattered into three buffers, 3 MiB + 1 across the aligned piece.
      std::vector<std::byte> a(3), b((size_t{3} << 20) - 5), c(3);
      const std::span<std::byte> parts[] = {a, b, c};
      const uint64_t scattered_at = aligned_at - 4097;
      auto n = (*read)->ReadScattered(scattered_at, parts);
      REQUIRE(n.ok());
      REQUIRE(*n == a.size() + b.size() + c.size());
      CHECK(a == Pattern(scattered_at, a.size()));
      CHECK(b == Pattern(scattered_at + a.size(), b.size()));
      CHECK(c == Pattern(scattered_at + a.size() + b.size(), c.size()));
      // Across the end of the file: a short read, the bytes up to the end.
      std::vector<std::byte> tail(size_t{3} << 20);
      const uint64_t tail_at = file_size - (size_t{2} << 20) - 11;
      auto t = (*read)->Read(tail_at, tail);
      REQUIRE(t.ok());
      REQUIRE(*t == file_size - tail_at);
      tail.resize(*t);
      CHECK(tail == Pattern(tail_at, tail.size()));
      if (mode == 3) {
        // Under 64 MiB read cold so far (the small file and the reads above): a large file
        // is still written through the page cache. Once 64 MiB have been read from a cold
        // input, large files are written direct too.
        CHECK_FALSE(ReadColdInput());
        const std::string input = JoinPath(s.path(), "cold-input");
        const size_t kInput = size_t{64} << 20;
        {
          const int fd = ::open(input.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
          REQUIRE(fd >= 0);
          const std::vector<std::byte> zeros(size_t{1} << 20);
          for (size_t done = 0; done < kInput; done += zeros.size()) {
            REQUIRE(::write(fd, zeros.data(), zeros.size()) ==
                    static_cast<ssize_t>(zeros.size()));
          }
          REQUIRE(::fdatasync(fd) == 0);
          ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
          ::close(fd);
        }
        auto in = PosixEnv()->OpenForRead(input);
        REQUIRE(in.ok());
        std::vector<std::byte> buffer(size_t{1} << 20);
        for (uint64_t from = 0; from < kInput; from += buffer.size()) {
          auto n = (*in)->Read(from, buffer);
          REQUIRE(n.ok());
          REQUIRE(*n == buffer.size());
        }
        CHECK(ReadColdInput());
        const std::string large = JoinPath(s.path(), "large-after-cold-input");
        auto out = PosixEnv()->CreateForWrite(large);
        REQUIRE(out.ok());
        REQUIRE((*out)->Reserve(file_size).ok());
        REQUIRE((*out)->WriteAt(5, Pattern(5, size_t{3} << 20)).ok());
        CHECK(ResidentPages(large) <= 2);  // the part-blocks at either end
        REQUIRE((*out)->Sync().ok());
        REQUIRE((*out)->Close().ok());
        ForgetColdInput();
        CHECK_FALSE(ReadColdInput());
      }
    }
  }
}

TEST_CASE("cancel: every later operation fails", "[io][cancel]") {
  testing::TempDir s;
  RequestCancel(15);
  auto w = WritableFile::Create(JoinPath(s.path(), "f"));
  ResetCancel();
  REQUIRE_FALSE(w.ok());
  CHECK(w.status().message().find("interrupted (signal 15)") != std::string::npos);
}

TEST_CASE("output dir: lock, nesting, sweep, commit", "[io][output]") {
  testing::TempDir s;
  const std::string out = JoinPath(s.path(), "out");
  REQUIRE(CreateDirectories(JoinPath(s.path(), "in/sub")).ok());
  // Nesting.
  for (const std::string& bad : {JoinPath(s.path(), "in"), JoinPath(s.path(), "in/sub"),
                                 JoinPath(s.path(), "in/new/deeper"), s.path()}) {
    INFO(bad);
    auto o = OutputDir::Open(bad, JoinPath(s.path(), "in"));
    REQUIRE_FALSE(o.ok());
    CHECK(o.status().code() == StatusCode::kInvalidArgument);
  }
  // Dead staging is swept, live staging (ours) is kept.
  const std::string dead = out + ".fc-tmp-999999999-abcdef";
  const std::string live = out + ".fc-tmp-" + std::to_string(getpid()) + "-abcdef";
  REQUIRE(CreateDirectories(dead).ok());
  REQUIRE(CreateDirectories(live).ok());
  {
    auto o = OutputDir::Open(out, JoinPath(s.path(), "in"));
    REQUIRE(o.ok());
    CHECK_FALSE(PathExists(dead));
    CHECK(PathExists(live));
    CHECK(PathExists(out + ".fc-lock"));
    // A second claim while the first holds the lock.
    auto second = OutputDir::Open(out, "");
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().code() == StatusCode::kFailedPrecondition);
    CHECK(second.status().message() == out + ": output in use by PID " +
                                           std::to_string(getpid()) + " (lock " + out +
                                           ".fc-lock)");
    auto w = WritableFile::Create(JoinPath((*o)->staging(), "f"));
    REQUIRE(w.ok());
    REQUIRE((*w)->Close().ok());
    CHECK_FALSE(PathExists(out));
    REQUIRE((*o)->Commit().ok());
  }
  CHECK(PathExists(JoinPath(out, "f")));
  CHECK_FALSE(PathExists(out + ".fc-lock"));
  REQUIRE(RemoveAll(live).ok());
  // A full OUT is refused; an abandoned claim leaves nothing.
  auto again = OutputDir::Open(out, "");
  CHECK(again.status().code() == StatusCode::kFailedPrecondition);
  const std::string out2 = JoinPath(s.path(), "out2");
  { REQUIRE(OutputDir::Open(out2, "").ok()); }
  auto names = ListDirectory(s.path());
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"in", "out"});
}

// Writes `name` holding `text` under `dir` through DefaultEnv().
void PutFile(const std::string& dir, const std::string& name, const std::string& text) {
  auto w = WritableFile::Create(JoinPath(dir, name));
  REQUIRE(w.ok());
  REQUIRE((*w)->Append(text).ok());
  REQUIRE((*w)->Close().ok());
}

std::string GetFile(const std::string& path) {
  auto bytes = ReadWholeFile(path, 1 << 20);
  REQUIRE(bytes.ok());
  return std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size());
}

// One --overwrite run: OUT holds "old" until the commit, "new" after it; nothing else is
// left beside OUT.
void CheckReplace(const std::string& parent) {
  const std::string out = JoinPath(parent, "out");
  REQUIRE(CreateDirectories(out).ok());
  PutFile(out, "old", "1");
  {
    auto refused = OutputDir::Open(out, "");
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().message() == out + ": output directory exists and is not empty");
  }
  {
    auto o = OutputDir::Open(out, "", ExistingOutput::kReplace);
    REQUIRE(o.ok());
    PutFile((*o)->staging(), "new", "2");
    CHECK(GetFile(JoinPath(out, "old")) == "1");  // untouched until the commit
    CHECK_FALSE(PathExists(JoinPath(out, "new")));
    REQUIRE((*o)->Commit().ok());
    CHECK(GetFile(JoinPath(out, "new")) == "2");
    CHECK_FALSE(PathExists(JoinPath(out, "old")));
  }
  auto names = ListDirectory(parent);
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"out"});  // no staging, old copy or lock
  // The claim to replace ended with its OutputDir: a plain claim refuses again.
  CHECK(OutputDir::Open(out, "").status().code() == StatusCode::kFailedPrecondition);
  // An abandoned replacing run leaves OUT as it was.
  {
    auto o = OutputDir::Open(out, "", ExistingOutput::kReplace);
    REQUIRE(o.ok());
    PutFile((*o)->staging(), "newer", "3");
  }
  CHECK(GetFile(JoinPath(out, "new")) == "2");
  CHECK_FALSE(PathExists(JoinPath(out, "newer")));
  names = ListDirectory(parent);
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"out"});
}

TEST_CASE("output dir: kReplace swaps a full OUT at the commit", "[io][output]") {
  SECTION("posix (renameat2 RENAME_EXCHANGE)") {
    testing::TempDir s;
    CheckReplace(s.path());
  }
  SECTION("in memory") {
    InMemoryEnv mem;
    ScopedEnvOverride scoped(&mem);
    REQUIRE(CreateDirectories("/w").ok());
    CheckReplace("/w");
  }
  SECTION("in memory, no exchange: the two-rename fallback") {
    InMemoryEnv mem;
    mem.DisableExchangeForTest();
    ScopedEnvOverride scoped(&mem);
    REQUIRE(CreateDirectories("/w").ok());
    CheckReplace("/w");
  }
}

TEST_CASE("output dir: a replacing commit that fails keeps the old OUT", "[io][output]") {
  for (bool exchange : {true, false}) {
    // Renames at the commit (an exchange counts as one): exchange: 1 (the swap); fallback:
    // 1 (the exchange, unsupported), 2 (OUT aside), 3 (staging onto OUT). Each failure
    // leaves OUT with the old files and nothing beside it.
    for (uint64_t nth : exchange ? std::vector<uint64_t>{1} : std::vector<uint64_t>{1, 2, 3}) {
      INFO("exchange " << exchange << ", failing rename #" << nth);
      InMemoryEnv mem;
      if (!exchange) mem.DisableExchangeForTest();
      FaultInjectingEnv faults(&mem);
      ScopedEnvOverride scoped(&faults);
      REQUIRE(CreateDirectories("/w/out").ok());
      PutFile("/w/out", "old", "1");
      {
        auto o = OutputDir::Open("/w/out", "", ExistingOutput::kReplace);
        REQUIRE(o.ok());
        PutFile((*o)->staging(), "new", "2");
        faults.ResetCounts();
        faults.FailNth(FaultOp::kRename, nth);
        Status committed = (*o)->Commit();
        CHECK(faults.Fired());
        REQUIRE_FALSE(committed.ok());
        CHECK_THAT(committed.message(), Catch::Contains("injected fault: rename"));
        faults.FailNth(FaultOp::kRename, 0);
      }
      CHECK(GetFile("/w/out/old") == "1");
      CHECK_FALSE(PathExists("/w/out/new"));
      auto names = ListDirectory("/w");
      REQUIRE(names.ok());
      CHECK(*names == std::vector<std::string>{"out"});
    }
  }
}

// A file's name lives in its directory: the commit syncs every directory of the staging
// tree, each after its subdirectories, then the parent of OUT after the rename.
TEST_CASE("output dir: the commit syncs every staging directory, children first",
          "[io][output]") {
  InMemoryEnv mem;
  FaultInjectingEnv faults(&mem);
  ScopedEnvOverride scoped(&faults);
  REQUIRE(CreateDirectories("/w").ok());
  std::vector<std::string> synced;  // in order, from the fault each sync in turn is made to be
  for (uint64_t nth = 1;; ++nth) {
    REQUIRE(nth < 10);
    REQUIRE(RemoveAll("/w/out").ok());
    auto o = OutputDir::Open("/w/out", "");
    REQUIRE(o.ok());
    const std::string staging = (*o)->staging();
    REQUIRE(CreateDirectories(staging + "/zero/p.a").ok());
    REQUIRE(CreateDirectories(staging + "/zero/p.b/deeper").ok());
    REQUIRE(CreateDirectories(staging + "/global_step1").ok());
    PutFile(staging + "/zero/p.a", "fp32.pt", "1");
    PutFile(staging, "latest", "2");
    faults.ResetCounts();
    faults.FailNth(FaultOp::kSync, nth);
    Status committed = (*o)->Commit();
    faults.FailNth(FaultOp::kSync, 0);
    if (!faults.Fired()) {
      REQUIRE(committed.ok());
      break;
    }
    REQUIRE_FALSE(committed.ok());
    const std::string message(committed.message());
    const size_t on = message.find(" on /w");
    REQUIRE(on != std::string::npos);
    std::string path = message.substr(on + 4);
    path = path.substr(0, path.find_first_of(" :"));
    if (path.starts_with(staging)) path = "STAGING" + path.substr(staging.size());
    synced.push_back(path);
    CHECK_FALSE(PathExists("/w/out/latest"));  // a failed sync before the rename: no OUT
  }
  const std::vector<std::string> dirs = {"STAGING/zero/p.a", "STAGING/zero/p.b/deeper",
                                         "STAGING/zero/p.b", "STAGING/zero",
                                         "STAGING/global_step1", "STAGING"};
  REQUIRE(synced.size() == dirs.size() + 1);  // and /w, after the rename
  CHECK(synced.back() == "/w");
  auto at = [&](const std::string& d) {
    return std::find(synced.begin(), synced.end(), d) - synced.begin();
  };
  for (const std::string& d : dirs) {
    INFO(d);
    CHECK(at(d) < static_cast<ptrdiff_t>(dirs.size()));  // synced, before the rename
    if (d != "STAGING") CHECK(at(d) < at(d.substr(0, d.rfind('/'))));  // before its parent
  }
  CHECK(GetFile("/w/out/zero/p.a/fp32.pt") == "1");
}

TEST_CASE("output dir: kReplace refuses a file or a symlink as OUT", "[io][output]") {
  testing::TempDir s;
  const std::string file = JoinPath(s.path(), "file");
  PutFile(s.path(), "file", "x");
  auto o = OutputDir::Open(file, "", ExistingOutput::kReplace);
  REQUIRE_FALSE(o.ok());
  CHECK(o.status().message() ==
        file + ": output exists and is not a directory; --overwrite replaces a directory only");
  REQUIRE(CreateDirectories(JoinPath(s.path(), "real")).ok());
  PutFile(JoinPath(s.path(), "real"), "keep", "k");
  const std::string link = JoinPath(s.path(), "link");
  REQUIRE(::symlink(JoinPath(s.path(), "real").c_str(), link.c_str()) == 0);
  auto l = OutputDir::Open(link, "", ExistingOutput::kReplace);
  REQUIRE_FALSE(l.ok());
  CHECK(l.status().code() == StatusCode::kFailedPrecondition);
  CHECK(GetFile(JoinPath(s.path(), "real/keep")) == "k");
}

}  // namespace
}  // namespace fc
