#include "fc/ops/run_stats.h"

#include <chrono>
#include <cstring>
#include <vector>

#include "fc/codec/json_writer.h"
#include "fc/io/file.h"

namespace fc {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Fixed-size binary record for the gather: eight little-endian-agnostic words (every process
// runs the same binary on the same kind of machine).
std::string Pack(const ProcessRunStats& s) {
  std::string bytes(sizeof(ProcessRunStats), '\0');
  std::memcpy(bytes.data(), &s, sizeof s);
  return bytes;
}

}  // namespace

RunStatsMeter::RunStatsMeter() : start_counts_(ProcessIoCounts()), start_seconds_(NowSeconds()) {}

void RunStatsMeter::InputsDone() { inputs_done_ = ProcessIoCounts(); }

ProcessRunStats RunStatsMeter::Finish(uint64_t peak_buffer_bytes, uint64_t bytes_sent,
                                      uint64_t bytes_received) const {
  const IoCounts now = ProcessIoCounts();
  const IoCounts reads = inputs_done_.value_or(now);
  ProcessRunStats s;
  s.bytes_read = reads.bytes_read - start_counts_.bytes_read;
  s.read_calls = reads.read_calls - start_counts_.read_calls;
  s.bytes_written = now.bytes_written - start_counts_.bytes_written;
  s.write_calls = now.write_calls - start_counts_.write_calls;
  s.peak_buffer_bytes = peak_buffer_bytes;
  s.bytes_sent = bytes_sent;
  s.bytes_received = bytes_received;
  s.seconds = NowSeconds() - start_seconds_;
  return s;
}

Status WriteRunStats(const std::string& path, const std::string& tool, uint64_t bytes_needed,
                     const ProcessRunStats& mine, Communicator& comm) {
  const std::vector<std::string> all = comm.Gather(Pack(mine), 0);
  Status written = Status::Ok();
  if (comm.rank() == 0) {
    JsonWriter j(JsonWriter::Style::kPretty);
    j.BeginObject().Key("tool").String(tool).Key("bytes_needed").Uint(bytes_needed);
    j.Key("processes").BeginArray();
    for (size_t r = 0; r < all.size(); ++r) {
      ProcessRunStats s;
      if (all[r].size() != sizeof s) {
        written = InternalError("stats message of " + std::to_string(all[r].size()) + " bytes");
        break;
      }
      std::memcpy(&s, all[r].data(), sizeof s);
      j.BeginObject(true).Key("rank").Int(static_cast<int64_t>(r));
      j.Key("bytes_read").Uint(s.bytes_read).Key("read_calls").Uint(s.read_calls);
      j.Key("bytes_written").Uint(s.bytes_written).Key("write_calls").Uint(s.write_calls);
      j.Key("bytes_sent").Uint(s.bytes_sent).Key("bytes_received").Uint(s.bytes_received);
      j.Key("peak_buffer_bytes").Uint(s.peak_buffer_bytes);
      j.Key("seconds").Fixed(s.seconds, 3).EndObject();
    }
    j.EndArray().EndObject();
    if (written.ok()) {
      written = [&]() -> Status {
        const std::string staged = path + ".tmp";
        FC_ASSIGN_OR_RETURN(auto out, WritableFile::Create(staged));
        FC_RETURN_IF_ERROR(out->Append(j.str() + "\n"));
        FC_RETURN_IF_ERROR(out->Close());
        return RenameDurably(staged, path);
      }();
    }
  }
  return comm.AllOk(written.With("--stats " + path));
}

}  // namespace fc
