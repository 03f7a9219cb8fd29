// jemalloc's compile-time options for the fc tools (linked only with -Djemalloc, see
// meson.build). jemalloc reads this symbol when it initialises; MALLOC_CONF in the
// environment still overrides it.
//
// Why huge pages: opening a checkpoint's metadata builds its whole index in memory (a
// million chunks is ~900 MB of small objects), and every 4 KiB page the heap touches for
// the first time is a page fault. Those cost microseconds each on virtual machines: with
// glibc's malloc fc-convert --dry-run at 1M chunks took 9.7-10.7 s, a third of it in the
// kernel for 490k faults; with this setting 4.2 s and 24k faults (bench/plan_scale.sh). The data path's buffers are
// bounded by --memory-budget either way; a huge page only rounds them up to 2 MiB.
//
// One arena: jemalloc's default is four per CPU, threads spread over them, and each arena a
// thread touches costs its first huge page. The tools' threads allocate little (their
// buffers are made once per job, and jemalloc's per-thread caches take the small objects),
// and a process under mpirun starts near the 32 MiB that --memory-budget leaves free for
// the process itself (fc-plan(5)): a 2 MiB page per worker thread's arena pushed small
// budgets over.

extern "C" {
// NOLINTNEXTLINE: the name and type are jemalloc's interface.
extern const char* const malloc_conf;
const char* const malloc_conf = "thp:always,metadata_thp:always,narenas:1";
}
