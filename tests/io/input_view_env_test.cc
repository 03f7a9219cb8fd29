// InputViewEnv (fc/io/input_view_env.h): the union of several processes' files, nested
// directories included, and reads of files on another process's disk answered from the
// ranges fetched for them.
#include <catch2/catch.hpp>

#include "fc/io/env.h"
#include "fc/io/input_view_env.h"

namespace fc {
namespace {

std::string Read(EnvReadableFile& f, uint64_t offset, size_t n, Status* status = nullptr) {
  std::string out(n, '\0');
  Result<size_t> got = f.Read(offset, std::as_writable_bytes(std::span(out.data(), out.size())));
  if (status) *status = got.status();
  if (!got.ok()) return "";
  out.resize(*got);
  return out;
}

InputViewEnv::Entry Elsewhere(uint64_t size, int reader) {
  InputViewEnv::Entry e;
  e.size = size;
  e.reader = reader;
  e.seen_by = "process " + std::to_string(reader);
  return e;
}

TEST_CASE("input view: nested union, local files, fetched ranges of others'") {
  InMemoryEnv mem;
  REQUIRE(mem.CreateDirectory("local").ok());
  REQUIRE(mem.CreateDirectory("local/tag").ok());
  REQUIRE(mem.WriteFileForTest("local/tag/mine.pt", "0123456789").ok());
  std::map<std::string, InputViewEnv::Entry> entries;
  InputViewEnv::Entry mine;
  mine.size = 10;
  mine.local = true;
  mine.seen_by = "process 1";
  entries["tag/mine.pt"] = mine;
  entries["tag/theirs.pt"] = Elsewhere(100, 0);
  entries["tag/deeper/x.pt"] = Elsewhere(4, 0);
  InputViewEnv view(&mem, "ckpt_{rank}", "local", entries);

  CHECK(view.Type("ckpt_{rank}", true) == EnvFileType::kDirectory);
  CHECK(view.Type("ckpt_{rank}/tag", true) == EnvFileType::kDirectory);
  CHECK(view.Type("ckpt_{rank}/tag/deeper", true) == EnvFileType::kDirectory);
  CHECK(view.Type("ckpt_{rank}/tag/theirs.pt", true) == EnvFileType::kRegular);
  CHECK(view.Type("ckpt_{rank}/tag/none.pt", true) == EnvFileType::kMissing);
  auto top = view.ListDirectory("ckpt_{rank}");
  REQUIRE(top.ok());
  CHECK(*top == std::vector<std::string>{"tag"});
  auto tag = view.ListDirectory("ckpt_{rank}/tag/");
  REQUIRE(tag.ok());
  CHECK(*tag == std::vector<std::string>{"deeper", "mine.pt", "theirs.pt"});
  CHECK(view.LocalFile("ckpt_{rank}/tag/mine.pt"));
  CHECK_FALSE(view.LocalFile("ckpt_{rank}/tag/theirs.pt"));
  CHECK(view.HasUnsharedFiles());

  auto local = view.OpenForRead("ckpt_{rank}/tag/mine.pt");
  REQUIRE(local.ok());
  CHECK(Read(**local, 2, 3) == "234");

  auto theirs = view.OpenForRead("ckpt_{rank}/tag/theirs.pt");
  REQUIRE(theirs.ok());
  CHECK((*theirs)->size() == 100);
  CHECK_FALSE((*theirs)->readable_here());
  Status status;
  Read(**theirs, 10, 4, &status);
  CHECK(status.code() == StatusCode::kNotFound);
  CHECK(status.message().find("only process 0 can read it") != std::string::npos);

  view.AddFetched("tag/theirs.pt", 8, std::make_shared<const std::string>("abcdefgh"));
  CHECK(Read(**theirs, 10, 4) == "cdef");
  CHECK(Read(**theirs, 8, 8) == "abcdefgh");
  Read(**theirs, 12, 8, &status);  // runs past the fetched range
  CHECK(status.code() == StatusCode::kNotFound);
}

TEST_CASE("input view: names with repeated slashes and '.' components are the entries") {
  // Readers join "dir/" + "/" + name when the input is given with a trailing slash.
  InMemoryEnv mem;
  REQUIRE(mem.CreateDirectory("local").ok());
  std::map<std::string, InputViewEnv::Entry> entries;
  entries["tag/theirs.pt"] = Elsewhere(100, 0);
  InputViewEnv view(&mem, "./ckpt_{rank}/", "local", entries);
  CHECK(view.Type("ckpt_{rank}//tag", true) == EnvFileType::kDirectory);
  CHECK(view.Type("ckpt_{rank}//tag/./theirs.pt", true) == EnvFileType::kRegular);
  CHECK(view.Type("./ckpt_{rank}/tag//theirs.pt", true) == EnvFileType::kRegular);
  auto top = view.ListDirectory("ckpt_{rank}/./");
  REQUIRE(top.ok());
  CHECK(*top == std::vector<std::string>{"tag"});
  auto f = view.OpenForRead("ckpt_{rank}//tag/theirs.pt");
  REQUIRE(f.ok());
  CHECK((*f)->size() == 100);
}

TEST_CASE("input view: while fetching, reads of files not on every process go through it") {
  InMemoryEnv mem;
  REQUIRE(mem.CreateDirectory("local").ok());
  REQUIRE(mem.WriteFileForTest("local/a.pt", "local bytes").ok());
  REQUIRE(mem.WriteFileForTest("local/everywhere.pt", "same").ok());
  std::map<std::string, InputViewEnv::Entry> entries;
  InputViewEnv::Entry a;
  a.size = 11;
  a.local = true;
  entries["a.pt"] = a;
  InputViewEnv::Entry all;
  all.size = 4;
  all.local = true;
  all.on_every_process = true;
  entries["everywhere.pt"] = all;
  entries["b.pt"] = Elsewhere(6, 1);
  InputViewEnv view(&mem, "in", "local", entries);

  std::vector<std::string> asked;
  view.SetFetch([&](const std::string& name, uint64_t offset, uint64_t length) -> Status {
    asked.push_back(name + "@" + std::to_string(offset) + "+" + std::to_string(length));
    if (name == "b.pt") {
      view.AddFetched(name, offset, std::make_shared<const std::string>(std::string(length, 'b')));
      return Status::Ok();
    }
    auto f = view.OpenLocal(name);
    if (!f.ok()) return f.status();
    std::string bytes(length, '\0');
    auto n = (*f)->Read(offset, std::as_writable_bytes(std::span(bytes.data(), bytes.size())));
    if (!n.ok()) return n.status();
    bytes.resize(*n);
    view.AddFetched(name, offset, std::make_shared<const std::string>(bytes));
    return Status::Ok();
  });
  auto fa = view.OpenForRead("in/a.pt");
  auto fb = view.OpenForRead("in/b.pt");
  auto fe = view.OpenForRead("in/everywhere.pt");
  REQUIRE((fa.ok() && fb.ok() && fe.ok()));
  CHECK((*fa)->readable_here());
  CHECK_FALSE((*fb)->readable_here());
  CHECK(Read(**fa, 0, 5) == "local");
  CHECK(Read(**fa, 1, 3) == "oca");  // inside a fetched range: not asked again
  CHECK(Read(**fb, 2, 10) == "bbbb");  // clamped to the file's 6 bytes
  CHECK(Read(**fe, 0, 4) == "same");   // on every process: read from its disk, not fetched
  CHECK(asked == std::vector<std::string>{"a.pt@0+5", "b.pt@2+4"});
  auto mapped = (*fb)->Map();  // the whole file, fetched
  REQUIRE(mapped.ok());
  CHECK(std::string(reinterpret_cast<const char*>(mapped->data), mapped->size) == "bbbbbb");
  CHECK(asked.back() == "b.pt@0+6");
  view.SetFetch({});
  // Without the fetch function, what was fetched stays readable; the rest is not.
  auto again = view.OpenForRead("in/b.pt");
  REQUIRE(again.ok());
  CHECK(Read(**again, 3, 2) == "bb");
}

}  // namespace
}  // namespace fc
