// The per-process part of a dry run's human report (export and convert). Private to ops/.
#ifndef FC_SRC_OPS_PLAN_REPORT_H_
#define FC_SRC_OPS_PLAN_REPORT_H_

#include <ostream>

#include "fc/plan/plan.h"

namespace fc {

// With several processes: one line on the exchange (rounds and their lower bound, transfers,
// read balance) and a table of what each process reads, sends, receives and writes; with
// more than 32 processes, the 16 that read most and a line on the rest. Lines fit 120
// columns. Nothing for one process.
void PrintProcessReport(const Plan& plan, std::ostream& out);

}  // namespace fc

#endif  // FC_SRC_OPS_PLAN_REPORT_H_
